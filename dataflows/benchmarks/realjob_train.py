"""A tiny real training job for ``trainguard bench realjob`` and the real-job tests (needs ``torch``).

Run by ``torchrun`` (gloo backend, CPU): a small MLP trained on synthetic data, its gradients
all-reduced by hand after each backward pass so that each rank can report its own *compute* time
(the step minus the time it waited in the collective) to :class:`~trainguard.probe.ProgressProbe`.
It prints what real jobs print, in torchtitan's log format: one line per step with the loss and
throughput, its checkpoint messages in torchtitan's own words, and nothing at all around an
evaluation loop.

Faults are injected from outside, never decided by the job: signals come from the harness, and a
rank's data loader reads a *fault file* (``--fault-dir``/``rank<N>``) before each batch, the way a
starved or corrupted input pipeline behaves:

- ``slow <seconds>``: the loader waits that long more per batch (a starved data loader);
- ``nan``: the batch is corrupted (the loss turns NaN);
- ``stall``: the loader blocks (a rank stuck in user code, for stack localisation).

``python -m trainguard.benchmarks.realjob_train --help`` lists the rest.
"""

from __future__ import annotations

import argparse
import io
import logging
import sys
import time
from datetime import timedelta
from pathlib import Path

_log = logging.getLogger("root")


class ThrottledFile(io.RawIOBase):
    """A file that writes at ``mib_per_s``: a checkpoint to a slow shared filesystem.

    Sleeping releases the GIL, as a blocked write to a network filesystem does.
    """

    def __init__(self, path: Path, mib_per_s: float) -> None:
        self._file = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._rate = mib_per_s * 2**20

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        n = self._file.write(data)
        time.sleep(n / self._rate)
        return n

    def close(self) -> None:
        self._file.close()
        super().close()


def read_fault(fault_dir: Path | None, rank: int) -> tuple[str, float]:
    """What the harness asks of this rank's data loader now: ``("", 0.0)`` when nothing."""
    if fault_dir is None:
        return "", 0.0
    try:
        words = (fault_dir / f"rank{rank}").read_text().split()
    except OSError:
        return "", 0.0
    if not words:
        return "", 0.0
    return words[0], float(words[1]) if len(words) > 1 else 0.0


def load_batch(torch, rank: int, step: int, args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The data loader: a synthetic batch, after whatever the fault file asks."""
    fault, value = read_fault(args.fault_dir, rank)
    time.sleep(args.load_s)
    if fault == "slow":
        time.sleep(value)
    while fault == "stall":  # stuck in user code: the process is alive, its stack is here
        time.sleep(1.0)
        fault, value = read_fault(args.fault_dir, rank)
    generator = torch.Generator().manual_seed(rank * 100_003 + step)
    x = torch.randn(args.batch, args.width, generator=generator)
    y = x.sum(dim=1, keepdim=True) * 0.1
    if fault == "nan":
        x[0, 0] = float("nan")
    return x, y


def evaluate(torch, model, args: argparse.Namespace) -> None:  # type: ignore[no-untyped-def]
    """An evaluation loop that prints nothing (many don't), paced like a real one."""
    with torch.no_grad():
        deadline = time.monotonic() + args.eval_s
        while time.monotonic() < deadline:
            model(torch.randn(args.batch, args.width))
            time.sleep(0.2)


def checkpoint(torch, model, rank: int, step: int, args: argparse.Namespace) -> None:  # type: ignore[no-untyped-def]
    """Rank 0 writes the state (torchtitan's messages, word for word); the others wait in a barrier."""
    import torch.distributed as dist

    if rank == 0:
        _log.info("Saving the checkpoint (or staging if async is enabled).")
        begin = time.monotonic()
        state = {"model": model.state_dict(), "step": step, "extra": torch.zeros(args.ckpt_mib * 2**18)}
        target = args.out / f"step-{step}.pt"
        with ThrottledFile(target, args.ckpt_mib_per_s) as fh:
            torch.save(state, fh)
        target.unlink()
        _log.info(
            f"Finished saving the checkpoint (or staging if async is enabled)in {time.monotonic() - begin:.2f} seconds."
        )
    dist.barrier()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--load-s", type=float, default=0.1, help="data loading time per batch")
    parser.add_argument("--compute-s", type=float, default=0.1, help="extra compute time per step (paces the job)")
    parser.add_argument("--fault-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--timeout-s", type=float, default=120.0, help="the process group's collective timeout")
    parser.add_argument("--ckpt-at", type=int, default=0, help="save a checkpoint after this step (0: never)")
    parser.add_argument("--ckpt-mib", type=int, default=64)
    parser.add_argument("--ckpt-mib-per-s", type=float, default=1.0)
    parser.add_argument("--eval-at", type=int, default=0, help="evaluate after this step (0: never)")
    parser.add_argument("--eval-s", type=float, default=30.0)
    parser.add_argument("--no-probe", action="store_true")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    logging.basicConfig(
        format="[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s", level=logging.INFO, stream=sys.stdout
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    probe = None
    if not args.no_probe:
        from trainguard.probe import ProgressProbe

        probe = ProgressProbe(rank=rank)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(args.width, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    _log.info(f"Training starts at step 1, with local batch size {args.batch}, world size {world}")
    for step in range(1, args.steps + 1):
        started = time.perf_counter()
        x, y = load_batch(torch, rank, step, args)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        time.sleep(args.compute_s)
        waited = time.perf_counter()
        flat = torch.cat([p.grad.flatten() for p in model.parameters()])
        dist.all_reduce(flat)
        reduced_loss = loss.detach().clone()
        dist.all_reduce(reduced_loss)
        waited = time.perf_counter() - waited
        offset = 0
        for p in model.parameters():
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad) / world)
            offset += p.numel()
        optimizer.step()
        step_s = time.perf_counter() - started
        if probe is not None:
            probe.step(step, step_time_s=step_s, compute_time_s=step_s - waited)
        tps = args.batch * args.width / step_s
        _log.info(
            f"step: {step:2}  loss: {reduced_loss.item() / world:7.4f}  memory:  0.01GiB(0.00%)  "
            f"tps: {tps:,.0f}  tflops: 0.00  mfu: 0.00%"
        )
        if step == args.eval_at:
            evaluate(torch, model, args)
        if step == args.ckpt_at:
            checkpoint(torch, model, rank, step, args)
    _log.info("Training completed")
    if probe is not None:
        probe.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
