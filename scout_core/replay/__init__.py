"""In-situ replay: capture, schedule, run and judge layer and optimizer recipes."""
