"""Rank bodies for the Bridge test: the real Callback / CallbackManager drive a training loop."""

from __future__ import annotations

from typing import Any


def bridge_loop_tp2(steps: int) -> dict[str, Any]:
    from scout_megatron import testing as mgt
    from scout_megatron.bridge import bridge_callbacks
    from scout_megatron.modules import chunk_modules
    from scout_megatron.optimizers import inner_optimizers
    from scout_megatron.testing.bridge_loop import run_bridge_loop

    api = bridge_callbacks()

    class Recorder(api.Callback):  # type: ignore[misc,name-defined]  # a runtime base class
        """Records what a ScoutCallback would use: chunks, optimizers, step numbers."""

        def __init__(self) -> None:
            self.events: list[tuple[str, int]] = []

        def on_train_start(self, context: Any) -> None:
            self.events.append(("on_train_start", context.state.train_state.step))
            (chunk,) = chunk_modules(context.model)
            context.user_state["layers"] = [number for number, _ in chunk.layers]
            context.user_state["inner"] = [
                type(i.optimizer).__name__ for i in inner_optimizers(context.optimizer)
            ]

        def on_train_step_start(self, context: Any) -> None:
            self.events.append(("on_train_step_start", context.state.train_state.step))

        def on_train_step_end(self, context: Any) -> None:
            self.events.append(("on_train_step_end", context.state.train_state.step))
            context.user_state.setdefault("losses", []).append(float(context.loss_dict["lm loss"]))

        def on_train_end(self, context: Any) -> None:
            self.events.append(("on_train_end", context.state.train_state.step))

    mgt.initialize(tensor_model_parallel_size=2)
    spec = mgt.TinyGPT()
    model = mgt.build_model(spec)
    ddp = mgt.wrap_ddp(model)
    opt = mgt.build_optimizer([model])

    recorder = Recorder()
    manager = api.CallbackManager()
    manager.add(recorder)
    seen: list[int] = []
    manager.register("on_train_step_end", lambda ctx: seen.append(ctx.state.train_state.step))
    state = run_bridge_loop(manager, [ddp], opt, spec, steps)

    # The same seed without callbacks trains to the same bits.
    with_callbacks = mgt.digest(model, opt)
    mgt.install_cpu_shims(1234)
    plain_model = mgt.build_model(spec)
    plain_ddp = mgt.wrap_ddp(plain_model)
    plain_opt = mgt.build_optimizer([plain_model])
    run_bridge_loop([], [plain_ddp], plain_opt, spec, steps)
    out = {
        "events": recorder.events,
        "functional": seen,
        "final_step": state.train_state.step,
        "user_state": {k: v for k, v in manager.user_state.items() if k != "losses"},
        "n_losses": len(manager.user_state["losses"]),
        "active": sorted(e for e in api.VALID_EVENTS if manager.has_callbacks(e)),
        "same_bits": with_callbacks == mgt.digest(plain_model, plain_opt),
    }
    mgt.teardown()
    return out
