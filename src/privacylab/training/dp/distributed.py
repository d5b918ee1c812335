"""DP-SGD across processes with ``torch.distributed``: each rank clips its share, noise once.

Abadi et al. 2016 ("Deep learning with differential privacy", CCS), Algorithm 1, run by W
processes (ranks) that hold identical copies of the model:

1. **One global Poisson sample.**  Every rank draws the same mask over the whole dataset of N
   examples from a shared seed (each example in with probability q), so the batch is exactly
   the one a single process would sample; it is then split among the ranks (``"balanced"``:
   contiguous blocks of the sorted sampled indices, sizes differing by at most one;
   ``"strided"``: example i goes to rank i mod W, so a rank only ever reads its own shard).
   A rank's share may be empty; it still takes part in the step.
2. **Local clipping.**  Per-example clipping needs only the example itself, so each rank
   computes Σ_{i ∈ share} ḡ_i with the engine's own clipping (ghost or per_sample), and the
   sum over ranks of these local sums is the global clipped sum Σ_{i ∈ batch} ḡ_i.
3. **Noise once.**  Rank 0 draws z ~ N(0, σ²C² I) with the engine's
   :class:`~privacylab.mechanisms.GaussianMechanism` (its seeded generator, or the OS CSPRNG
   with ``secure_noise``) and adds it to its local sum *before* the all-reduce; the other ranks
   add nothing.  The all-reduce (SUM) then gives every rank the same
   ``z + Σ_r Σ_{i ∈ share_r} ḡ_i = z + Σ_{i ∈ batch} ḡ_i`` — one draw of the Gaussian mechanism
   on a sum whose L2 sensitivity (add/remove one example) is C, because one example lies in
   exactly one rank's share and contributes at most C.  Drawing the noise on one rank also
   works for unseedable (secure) noise and does not require the ranks' noise generators to agree.
   Rank 0 draws the parameters' noise in the order a single process would (the order its
   clipping forms the layers' sums), so with the same seed the noise is the same numbers.
   (The other sound choice — every rank drawing the same z from identically seeded generators
   and adding it after the all-reduce — releases the same single draw; it needs seeded noise.)
   The ranks are trusted with the data, as a single process is: the guarantee is about what
   leaves the group (the model and what is computed from it), not about what ranks exchange.
4. **Same update everywhere.**  Each rank divides by the global expected batch size L = q·N,
   writes ``.grad`` and calls its optimizer; the all-reduced tensor is the same on every rank
   (gloo's and NCCL's algorithms compute each element's sum once and pass it on), so the models
   stay identical.  This is checked, not assumed: every ``check_every`` steps a fingerprint of
   each rank's parameters (exact integer sums of their bits, :func:`model_fingerprint`) is
   gathered with the step's other metadata, and any difference stops every rank with one line
   (a rank given another model or optimizer state, a model changed on one rank); the sampled
   batch (size and index sum), σ and the step count are compared at every step, which catches
   a rank given another seed.  Settings, seed, parameter layout, optimizer and model are
   compared once at set-up.
5. **Accounting.**  Each rank's ``engine.ledger`` records ``PoissonSampled(q, Gaussian(σ))``
   per step with the *global* q, exactly the event the single-process engine records.

Opacus' ``DistributedDPOptimizer`` (``opacus/optimizers/ddpoptimizer.py``) also adds the noise
only on rank 0 and all-reduces the (noised) per-rank sums; its
``DistributedUniformWithReplacementSampler`` instead lets each rank Poisson-sample its own
shard with its own generator and skips empty local batches, so ranks can take different
numbers of steps.  Here the sample is global and shared, empty shares take part in every step,
and the ranks' agreement is verified.

The collectives of one step are two: a small ``all_gather`` of metadata and one
``all_reduce`` per (dtype, device) group of the flattened clipped sums.  Every problem found
on one rank (wrong number of examples, a clipping error) is exchanged before it is raised, so
all ranks stop together instead of one waiting in a collective for a rank that has left.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from torch import Tensor, nn

from privacylab.training.dp.clipping import ClippedBatch, GradientBuffers
from privacylab.training.dp.engine import DPSGD
from privacylab.training.dp.errors import DPSGDError, check_count
from privacylab.training.dp.sampling import PoissonSampler

Partition = Literal["balanced", "strided"]
PARTITIONS: tuple[str, ...] = ("balanced", "strided")

_OK, _FAILED = 0, 1
_SETUP_ITEMS = 15


@dataclass(frozen=True)
class DistributedStepResult:
    """What one distributed DP-SGD step reports (the same on every rank except the local
    fields).

    Attributes:
        loss_mean: mean per-example loss over the whole realised batch (NaN if it is empty).
        batch_size: realised size of the global Poisson batch.
        local_batch_size: how many of those examples this rank clipped.
        norms: (local_batch_size,) this rank's per-example gradient norms before clipping.
    """

    loss_mean: float
    batch_size: int
    local_batch_size: int
    norms: Tensor


def _digest(text: str) -> int:
    """63 bits of SHA-256 of ``text``, for comparing strings across ranks."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def _bits(value: float) -> int:
    """The IEEE-754 bits of a float64 as an int64, so that ranks compare floats exactly."""
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


def _float(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", bits))[0]


def model_fingerprint(params: Sequence[Tensor]) -> tuple[int, int]:
    """(Σ_k S_k, Σ_k (k+1)·S_k) mod 2⁶³, with S_k the integer sum of parameter k's bit patterns.

    The bits of each tensor are read as 32-bit (16-bit, 8-bit for smaller dtypes) integers and
    summed exactly in int64, so the result does not depend on the order of the reduction (thread
    count, device kernels) and is equal exactly when the tensors are bitwise equal — up to
    changes that leave every S_k unchanged (e.g. two elements of one tensor swapped), which the
    same update on every rank cannot produce.
    """
    if not params:
        return 0, 0
    sums = []
    with torch.no_grad():
        for p in params:
            flat = p.detach().reshape(-1)
            words = {1: torch.uint8, 2: torch.int16}.get(flat.element_size(), torch.int32)
            sums.append(flat.view(words).sum(dtype=torch.int64))
    totals = [int(v) for v in torch.stack(sums).tolist()]
    first = sum(totals) % 2**63
    second = sum((k + 1) * v for k, v in enumerate(totals)) % 2**63
    return first, second


class DistributedDPSGD:
    """Run a :class:`~privacylab.training.dp.DPSGD` engine's steps across ``torch.distributed``
    ranks: one global Poisson sample, local clipping, the noise added once (module docstring).

    Every rank builds the same model (same initial parameters), the same optimizer and the same
    engine — ``sample_rate=q`` (the global q) and ``expected_batch_size=q·N`` — and wraps it
    with the same ``num_examples`` and ``seed``.  Each rank then iterates over its shares and
    steps on its own examples::

        dist_engine = DistributedDPSGD(engine, num_examples=len(X), seed=0)
        for indices in dist_engine:            # one epoch in expectation: round(1/q) steps
            dist_engine.step(X[indices], Y[indices])

    With the same seeds (sampling, and the noise generator on rank 0) the models are those of
    one process running ``engine.step`` on ``PoissonSampler(N, q, torch.Generator()
    .manual_seed(seed))`` batches, up to floating-point summation order, and the ledger holds
    the same events.  Pass the plain module, not a ``DistributedDataParallel`` wrapper: the
    gradients are all-reduced here, once, after clipping.  The engine's step hooks are not run.
    Only rank 0's noise generator is used.  With NCCL, call ``torch.cuda.set_device(local_rank)``
    before constructing (metadata travels on the current device).

    Args:
        engine: the DP-SGD engine of this rank.
        num_examples: N, the size of the whole dataset (all ranks together).
        seed: seed of the shared Poisson sampler; must be the same on every rank.
        group: process group (default: the world).
        partition: how the sampled indices are split among ranks: ``"balanced"`` or
            ``"strided"`` (see the module docstring).
        check_every: compare the ranks' model fingerprints before every this many steps (≥ 1;
            the models are also compared at set-up).  A fingerprint reads every parameter
            once: about 2 ms for the 535k-parameter MLP on one CPU thread (7% of its ghost
            step), so it is not done every step by default; :meth:`verify` checks at any time.

    Raises:
        DPSGDError: torch.distributed not initialised, an engine without ``sample_rate``, an
            expected batch size other than q·N, a DistributedDataParallel model, registered
            step hooks, or any rank disagreeing with rank 0 on the model or settings (every
            rank raises the same line).
    """

    def __init__(
        self,
        engine: DPSGD,
        num_examples: int,
        *,
        seed: int,
        group: dist.ProcessGroup | None = None,
        partition: Partition = "balanced",
        check_every: int = 10,
    ) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise DPSGDError(
                "DistributedDPSGD needs torch.distributed initialised first "
                "(torch.distributed.init_process_group)"
            )
        self.engine = engine
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        backend = dist.get_backend(group)
        self._device = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else torch.device("cpu")
        )
        problem: str | None = None
        try:
            self._check_local(engine, num_examples, seed, partition, check_every)
        except DPSGDError as error:
            problem = str(error)
        self.num_examples = num_examples
        self.seed = seed
        self.partition = partition
        self.check_every = check_every
        self._agree_on_setup(problem)
        self.sample_rate = float(engine.sample_rate)  # type: ignore[arg-type]  # not None here
        self.sampler = PoissonSampler(
            num_examples, self.sample_rate, generator=torch.Generator().manual_seed(seed)
        )
        self._names = list(engine.params)
        self._position = {name: k for k, name in enumerate(self._names)}
        self._global: Tensor | None = None
        self._share: Tensor | None = None
        self._draws = 0

    @staticmethod
    def _check_local(
        engine: DPSGD, num_examples: int, seed: int, partition: str, check_every: int
    ) -> None:
        if not isinstance(engine, DPSGD):
            raise DPSGDError(f"engine must be a DPSGD engine, got {type(engine).__name__}")
        check_count("num_examples", num_examples)
        check_count("check_every", check_every)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise DPSGDError(f"seed must be a whole number >= 0, got {seed!r}")
        if partition not in PARTITIONS:
            raise DPSGDError(f"partition must be one of {', '.join(PARTITIONS)}, got {partition!r}")
        q = engine.sample_rate
        if q is None:
            raise DPSGDError(
                "the engine has no sample_rate: give DPSGD(sample_rate=q) with the global q so "
                "that every step is accounted as PoissonSampled(q, Gaussian(σ))"
            )
        expected = q * num_examples
        if not math.isclose(engine.expected_batch_size, expected, rel_tol=1e-9):
            raise DPSGDError(
                f"the engine divides by expected_batch_size={engine.expected_batch_size:g} but "
                f"the global expected batch size q·N is {expected:g}; use expected_batch_size=q·N"
            )
        if isinstance(engine.model, nn.parallel.DistributedDataParallel):
            raise DPSGDError(
                "pass the plain model, not DistributedDataParallel: DistributedDPSGD all-reduces "
                "the clipped sums itself (DDP would average the unclipped gradients)"
            )
        if engine.has_step_hooks:
            raise DPSGDError("DistributedDPSGD does not run the engine's step hooks; remove them")
        engine.check_generator()

    def _setup_items(self) -> list[tuple[str, int]]:
        engine = self.engine
        params = list(engine.params.values())
        layout = [(n, tuple(p.shape), str(p.dtype)) for n, p in engine.params.items()]
        hyper = [
            {k: v for k, v in g.items() if k != "params"} for g in engine.optimizer.param_groups
        ]
        fingerprint = model_fingerprint(params)
        return [
            ("dataset size N", self.num_examples),
            ("sample rate q", _bits(engine.sample_rate)),  # type: ignore[arg-type]
            ("sampling seed", self.seed),
            ("partition", _digest(self.partition)),
            ("check_every", self.check_every),
            ("noise multiplier", _bits(engine.noise_multiplier)),
            ("secure_noise setting", int(engine.mechanism.secure)),
            ("max_grad_norm", _bits(engine.max_grad_norm)),
            ("expected batch size", _bits(engine.expected_batch_size)),
            ("per-layer thresholds", _digest(repr(engine.thresholds.per_parameter))),
            ("number of steps taken", engine.steps),
            ("parameter names, shapes and dtypes", _digest(repr(layout))),
            ("optimizer", _digest(f"{type(engine.optimizer).__name__}{hyper!r}")),
            ("model parameters", fingerprint[0]),
            ("model parameters", fingerprint[1]),
        ]

    def _agree_on_setup(self, problem: str | None) -> None:
        items = [] if problem is not None else self._setup_items()
        names = [name for name, _ in items]
        vector = [_FAILED if problem is not None else _OK]
        vector += [value for _, value in items] or [0] * _SETUP_ITEMS
        rows = self._gather(vector)
        if problem is not None:
            raise DPSGDError(problem)
        for r, row in enumerate(rows):
            if row[0] != _OK:
                raise DPSGDError(f"rank {r} could not set up DistributedDPSGD (see its error)")
        for r, row in enumerate(rows[1:], start=1):
            for k, name in enumerate(names, start=1):
                if row[k] != rows[0][k]:
                    raise DPSGDError(
                        f"rank {r} disagrees with rank 0 on the {name}: every rank must build "
                        "the same model, optimizer and DP settings and use the same seed"
                    )

    def _gather(self, values: list[int]) -> list[list[int]]:
        """Every rank's ``values`` (int64; the same length on every rank), in rank order."""
        vector = torch.tensor(values, dtype=torch.int64, device=self._device)
        rows = [torch.empty_like(vector) for _ in range(self.world_size)]
        dist.all_gather(rows, vector, group=self.group)
        return torch.stack(rows).tolist()

    def split(self, indices: Tensor) -> Tensor:
        """This rank's share of a global batch of (sorted) dataset indices."""
        if self.partition == "strided":
            return indices[indices % self.world_size == self.rank]
        return indices.tensor_split(self.world_size)[self.rank]

    def next_share(self) -> Tensor:
        """Draw the next global Poisson batch (the same on every rank) and return the dataset
        indices this rank clips in the next :meth:`step` (possibly none)."""
        self._global = self.sampler.sample()
        self._share = self.split(self._global)
        self._draws += 1
        return self._share

    def __iter__(self) -> Iterator[Tensor]:
        for _ in range(self.sampler.steps_per_epoch):
            yield self.next_share()

    def __len__(self) -> int:
        return self.sampler.steps_per_epoch

    @property
    def global_batch(self) -> Tensor | None:
        """The indices of the current global Poisson batch (all ranks' shares together)."""
        return self._global

    def verify(self) -> None:
        """Compare the ranks' model fingerprints now (a collective: every rank must call it)."""
        rows = self._gather(list(model_fingerprint(list(self.engine.params.values()))))
        self._check_models(rows, 0, "now")

    def _check_models(self, rows: list[list[int]], start: int, when: str) -> None:
        for r, row in enumerate(rows[1:], start=1):
            if row[start : start + 2] != rows[0][start : start + 2]:
                raise DPSGDError(
                    f"rank {r}'s model differs from rank 0's {when}: the ranks have diverged "
                    "(another initial model or optimizer state, or a model changed on one rank)"
                )

    def step(self, x: Tensor | Sequence[Tensor], y: Tensor) -> DistributedStepResult:
        """One distributed DP-SGD step on this rank's share (from :meth:`next_share`).

        A collective: every rank must call it once per drawn batch, also with an empty share.
        Rank 0 draws the noise tensors in the order in which a single process's
        :meth:`DPSGD.step` would draw them — the order in which clipping first touches each
        parameter's sum buffer (by increasing layer size under ghost clipping, parameter order
        for an empty batch, and the discarded draws of an ``auto`` switch to per_sample), taken
        from the first rank with a non-empty share — so the same generator gives the same noise.
        """
        engine = self.engine
        share, batch_indices, draws = self._share, self._global, self._draws
        self._share, self._global, self._draws = None, None, 0
        local = int(y.shape[0])
        error: Exception | None = None
        clipped: ClippedBatch | None = None
        order: list[str] = []

        def record(name: str, p: Tensor) -> Tensor:
            order.append(name)
            return torch.zeros_like(p)

        step = engine.steps + 1
        if share is None or batch_indices is None:
            error = DPSGDError(f"rank {self.rank} called step() without next_share() first")
        elif draws != 1:
            error = DPSGDError(
                f"rank {self.rank} drew {draws} batches with next_share() since its last step; "
                "draw one per step (a skipped batch would change the sampling the ε assumes)"
            )
        elif local != len(share):
            error = DPSGDError(
                f"rank {self.rank} was given {local} examples but its share of the Poisson batch "
                f"of step {step} has {len(share)}; pass exactly the examples of next_share()"
            )
        else:
            try:
                clipped = engine.clipped_batch(x, y, GradientBuffers(engine.params, record))
            except Exception as caught:  # raised below, after every rank knows to stop
                error = caught
        if batch_indices is None:
            batch_indices = torch.zeros(0, dtype=torch.long)
        check = engine.steps % self.check_every == 0
        fingerprint = model_fingerprint(list(engine.params.values())) if check else (0, 0)
        loss = float(clipped.loss.double().sum()) if clipped is not None and local else 0.0
        vector = [
            _OK if error is None else _FAILED,
            local,
            batch_indices.numel(),
            int(batch_indices.sum()),
            _bits(engine.noise_multiplier),
            engine.steps,
            _bits(loss),
            *fingerprint,
            *[self._position[n] for n in order[: 2 * len(self._names)] if clipped is not None],
        ]
        vector += [-1] * (9 + 2 * len(self._names) - len(vector))
        rows = self._gather(vector)
        self._check_step(rows, error, step, check)
        assert clipped is not None
        total = rows[0][2]
        source = next((row[9:] for row in rows if row[1] > 0), range(len(self._names)))
        names = [self._names[k] for k in source if k >= 0]
        with torch.no_grad():
            sums = clipped.grad_sum
            if self.rank == 0:
                noise = {name: engine.mechanism.noise(engine.params[name]) for name in names}
                for name, drawn in noise.items():
                    sums[name] = drawn.add_(sums[name])
            self._all_reduce(sums)
            scale = 1.0 / engine.expected_batch_size
            for name, p in engine.params.items():
                p.grad = sums[name].mul_(scale)
            engine.record_step()
        engine.optimizer.step()
        engine.optimizer.zero_grad()
        loss_sum = sum(_float(row[6]) for row in rows)
        loss_mean = loss_sum / total if total else math.nan
        return DistributedStepResult(loss_mean, total, local, clipped.norms)

    def _check_step(
        self,
        rows: list[list[int]],
        error: Exception | None,
        step: int,
        check: bool,
    ) -> None:
        if error is not None:
            raise error
        for r, row in enumerate(rows):
            if row[0] != _OK:
                raise DPSGDError(
                    f"rank {r} failed in step {step} (see its error); every rank stops"
                )
        for r, row in enumerate(rows[1:], start=1):
            if row[2:4] != rows[0][2:4]:
                raise DPSGDError(
                    f"rank {r} drew another Poisson batch than rank 0 in step {step}: every rank "
                    "must use the same seed and call next_share() once per step"
                )
            if row[4] != rows[0][4]:
                raise DPSGDError(
                    f"rank {r} uses noise multiplier {_float(row[4]):g} but rank 0 uses "
                    f"{_float(rows[0][4]):g}"
                )
            if row[5] != rows[0][5]:
                raise DPSGDError(f"rank {r} has taken {row[5]} steps but rank 0 {rows[0][5]}")
        if check:
            self._check_models(rows, 7, f"before step {step}")

    def _all_reduce(self, sums: dict[str, Tensor]) -> None:
        groups: dict[tuple[torch.dtype, torch.device], list[str]] = {}
        for name in self._names:
            groups.setdefault((sums[name].dtype, sums[name].device), []).append(name)
        for names in groups.values():
            flat = torch.cat([sums[n].reshape(-1) for n in names])
            on_device = flat.to(self._device) if self._device.type == "cuda" else flat
            dist.all_reduce(on_device, op=dist.ReduceOp.SUM, group=self.group)
            flat = on_device.to(flat.device)
            offset = 0
            for n in names:
                size = sums[n].numel()
                sums[n] = flat[offset : offset + size].view_as(sums[n])
                offset += size
