"""What SCOUT writes down: evidence records (JSON lines) and their rendering for people."""
