"""A plain shuffled ``DataLoader`` that resumes at the exact batch, unchanged scripts and all.

Lightning restores a loader's position only when the loader itself is stateful. A plain
``DataLoader(shuffle=True)`` is not: after a resume it starts its epoch again, with a
new order. Its ``RandomSampler`` draws the order's seed from the global torch generator
when the epoch's iteration starts, so the resumed run, whose generator is elsewhere by
then, sees other batches than an uninterrupted one (the loss curve parts from
``python train.py`` at the first handover, step 25 under the launcher).

Under the launcher the callback rebuilds each plain training ``DataLoader`` around a
:class:`ResumingBatchSampler`. In a run that is not resumed it does what the original
does, draw for draw: the same seed taken from the global generator at the same moment,
the same order, the same batches. It remembers the epoch's seed; the callback stores it
with the number of batches done in the epoch in every checkpoint. A resumed run then
builds the same order from that seed, without drawing, and skips the batches done.
Under DDP (Lightning's ``DistributedSampler``, ordered by epoch alone) only the skip is
needed; on another world size the skip covers the same number of samples.

Several training loaders (a dict or list, which Lightning combines in ``max_size_cycle``
mode) each advance one batch per training batch, and a shorter one starts a new pass over
its data, with a new order drawn from the global generator, whenever it runs out. The
sampler keeps the passes of the epoch (seed, first batch, batches yielded), so the
position it saves is the pass the run stood in and the batch inside it; the resumed run
starts there and its later passes draw their orders as the uninterrupted run did. A
stream counts only its epoch's batches: one that Lightning cycles because it is shorter
than another loader resumes at the start of a pass, not at its batch.

A plain ``DataLoader`` over an ``IterableDataset`` (a stream: no sampler to seed, and
PyTorch refuses a batch sampler for it) is rebuilt as a :class:`ResumingStreamLoader`
instead: a resumed run iterates the stream from the epoch's start again and drops the
batches each process had done, so a stream that yields the same batches each time it is
iterated (its own seed, a file, a shard by rank) continues at the exact batch; the
dropped batches are loaded, not trained on.

With DataLoader workers, randomness drawn inside them (augmentations) is replayed too
(:class:`WorkerReplayingLoader`, and the stream loader likewise): each iterator's base
seed is drawn again from the generator state its checkpoint kept, and the workers load
the batches already done before the first one Lightning sees. Persistent workers keep
their generators from pass to pass: each reports them with every batch, each pass keeps
them as it began, and a resume starts its workers there. A resumed Lightning creates
the epoch's iterator before it sets the samplers' epoch, and workers draw indices as
soon as they start, so the sampler sets the epoch itself (a ``DistributedSampler``
ordered the resumed epoch as epoch 0's otherwise).

A ``RandomSampler`` with the script's own generator (``DataLoader(shuffle=True,
generator=g)``) draws every pass's order from it, and the iterator its workers' base
seeds: each pass keeps the generator's state as it began drawing its order, a resume
inside the pass sets it there before the order is drawn, and the script's generators as
they stood at the checkpoint are restored before the resumed run's first iterator, so
the later passes draw as the uninterrupted run's (a new process starts them at their
seed again: every batch after the resume differed).

Left alone: loaders that are not a plain ``torch.utils.data.DataLoader`` (they may be
stateful already, like torchdata's ``StatefulDataLoader`` or
:class:`~lightning_srifty.ResumableLoader`). Randomness inside the dataset drawn from
the global generator in the main process is not replayed for the one batch Lightning
fetches ahead before a resume restores the generators.
"""

from __future__ import annotations

import array
import math
import random
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

STATE_VERSION = 1

RawRngState = tuple[bytes, tuple[str, bytes, int, int, float], tuple[int, bytes, Any]]
"""A worker's generators as plain bytes (torch; numpy; ``random``): a few microseconds
to take and to send with each batch, where tensors would each pass through shared memory
(measured: 0.12 ms to unpickle the dict form in the training process, per batch)."""
WorkerRng = RawRngState | dict[str, Any]
"""A worker's generators: as it sent them, or as a checkpoint keeps them."""


@dataclass
class _Pass:
    """One pass of a batch sampler over its data within a training epoch."""

    before: int
    """Training batches of the epoch done before this pass's first yielded batch."""
    start: int
    """Index in the pass of its first yielded batch (the batches a resume skipped)."""
    seed: int | None
    yielded: int = 0
    base_state: torch.Tensor | None = None
    """The generator state the pass's loader iterator drew its workers' base seed from."""
    worker_states: list[WorkerRng | None] | None = None
    """Persistent workers: each worker's generators as the pass began (``None`` for one
    still as its base seed left it); ``None`` for per-epoch workers, or a pass whose
    workers' generators were not read."""
    finished: bool = False
    """Every batch of the pass was yielded (a shorter loader Lightning cycles)."""
    order_state: torch.Tensor | None = None
    """A ``RandomSampler`` with the script's own generator: that generator's state as the
    pass began drawing its order (after its iterator drew the workers' base seed)."""


class ResumingBatchSampler:
    """Batches of an inner batch sampler; remembers the shuffle seed, resumes by skipping.

    Args:
        inner: The loader's own batch sampler (a ``BatchSampler`` over its sampler).
        current_epoch: The Trainer's epoch. Lightning calls ``set_epoch`` on the inner
            sampler, never on a batch sampler, so without it the epoch is the one
            ``set_epoch`` or a resume last set.
        loader_generator: The loader's own ``generator``, if the script gave one: its
            iterators draw their workers' base seeds from it, so a checkpoint keeps it.
    """

    def __init__(
        self,
        inner: Any,
        current_epoch: Callable[[], int] | None = None,
        loader_generator: torch.Generator | None = None,
    ) -> None:
        self.inner = inner
        self._current_epoch = current_epoch
        self.sampler = getattr(inner, "sampler", None)
        """Where Lightning looks for ``set_epoch`` (a ``DistributedSampler`` under DDP)."""
        own = getattr(self.sampler, "generator", None)
        self._script_order = own if isinstance(self.sampler, RandomSampler) else None
        """The script's own generator of a ``RandomSampler``: it draws every pass's order,
        so a resume sets it where the pass began (the seed is the script's, once)."""
        mine = [g for g in (self._script_order, loader_generator) if g is not None]
        self._script_generators = [g for i, g in enumerate(mine) if g not in mine[:i]]
        """The script's generators this loader draws from (its order, its workers' base
        seeds), each kept per rank in the checkpoint as it stands."""
        self.batch_size = getattr(inner, "batch_size", None)
        self.drop_last = getattr(inner, "drop_last", False)
        self.epoch = 0
        self.seed: int | None = None
        """The seed of this pass's order (a ``RandomSampler`` without its own generator)."""
        self._pending: dict[str, Any] | None = None
        self._pending_base: torch.Tensor | None = None
        self._passes: list[_Pass] = []
        self._passes_epoch: int | None = None
        self.next_base_state: torch.Tensor | None = None
        """Set by :class:`WorkerReplayingLoader` before each iterator: its base seed's
        generator state, kept with the pass that iterator runs."""
        self.next_worker_states: list[WorkerRng | None] | None = None
        """Set likewise for persistent workers: their generators as the pass begins."""
        self._pending_workers: list[dict[str, Any] | None] | None = None
        self._order_generator: torch.Generator | None = None
        """The generator this sampler last lent the ``RandomSampler`` (not the script's)."""
        self.replaying = False
        """Set by :class:`WorkerReplayingLoader`: yield the batches a resume skips too (it
        drops them after its workers have loaded them)."""
        self.handed_out = 0
        """Batches of the last pass handed to its iterator (the dropped ones too)."""
        self.worker_log: _PersistentWorkerLog | None = None
        """Set by :class:`WorkerReplayingLoader` with persistent workers: what they
        reported."""

    def __len__(self) -> int:
        return len(self.inner)

    def _epoch(self) -> int:
        return int(self._current_epoch()) if self._current_epoch is not None else self.epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        setter = getattr(self.sampler, "set_epoch", None)
        if setter is not None:
            setter(epoch)

    def resume(
        self, state: dict[str, Any], world_size: int, base_state: torch.Tensor | None = None
    ) -> None:
        """Continue the epoch ``state`` describes at its next batch (on the next ``iter``).
        ``base_state``: this rank's :meth:`worker_base_state` from the same checkpoint."""
        if state.get("state_version") != STATE_VERSION:
            return
        self._pending = dict(state, resumed_world=max(int(world_size), 1))
        self._pending_base, self._pending_workers = _split_worker_state(base_state)
        self.epoch = int(state.get("epoch", 0))

    def _holder(self, batches_done: int) -> _Pass | None:
        """The pass of this epoch that holds the next batch: one already begun at it (its
        order drawn) holds it at its first batch."""
        if self._passes_epoch != self._epoch() or not self._passes:
            return None
        return next((p for p in reversed(self._passes) if p.before <= batches_done), None)

    def worker_base_state(
        self, batches_done: int, *, epoch_closed: bool = False
    ) -> torch.Tensor | dict[str, Any] | None:
        """The generator state the iterator of the pass holding the next batch drew its
        workers' base seed from (``None`` without workers), for the checkpoint; with
        persistent workers, ``{"base": state, "workers": [...]}`` adds each worker's
        generators as the pass began, or where ``epoch_closed`` as it ended (the next
        pass begins there)."""
        holder = self._holder(int(batches_done))
        if holder is None:
            # as :meth:`position`: the pass under way (saved after its epoch was counted)
            holder = self._passes[-1] if self._passes else None
        if holder is None or holder.base_state is None:
            return None
        if epoch_closed and self.worker_log is not None:
            now = self.worker_log.states_now()
            if now is None or not self.worker_log.all_arrived(self):
                return None  # workers still loading batches past the epoch's end
            return {"base": holder.base_state, "workers": _saved(now), "closed": True}
        if holder.worker_states is None:
            return holder.base_state
        return {"base": holder.base_state, "workers": _saved(holder.worker_states)}

    def forget_worker_states(self, began: list[WorkerRng | None]) -> None:
        """The pass whose states would be ``began`` keeps none (nothing to replay it)."""
        for p in self._passes:
            if p.worker_states is began:
                p.worker_states, p.base_state = None, None

    def closed_worker_states(self) -> tuple[torch.Tensor, list[dict[str, Any] | None]] | None:
        """(base seed's generator state, persistent workers' generators) where the
        pending resume starts after a closed epoch's pass that kept them."""
        pending = self._pending
        if pending is None or not pending.get("closed"):
            return None
        if self._pending_base is None or self._pending_workers is None:
            return None
        return self._pending_base, self._pending_workers

    def _resolve(self, pending: dict[str, Any] | None) -> tuple[dict[str, Any] | None, int, int]:
        """(the position a new pass resumes at or ``None``, batches it skips, training
        batches of the epoch before it) for the pass about to begin."""
        before = self._passes[-1].before + self._passes[-1].yielded if self._passes else 0
        if (
            pending is None
            or pending.get("closed")
            or int(pending.get("epoch", -1)) != self._epoch()
        ):
            return None, 0, before  # not resumed, or the checkpoint closed its epoch
        scale = int(pending.get("world_size", 1)) / pending["resumed_world"]
        return (
            pending,
            math.ceil(int(pending.get("batches", 0)) * scale),
            math.ceil(int(pending.get("before", 0)) * scale),
        )

    def worker_replay(
        self,
    ) -> tuple[torch.Tensor, int, list[dict[str, Any] | None] | None] | None:
        """(base seed's generator state, batches to load and drop, persistent workers'
        generators as the pass began or ``None``) when the next pass resumes one a
        checkpoint recorded with its workers' base seed; ``None`` otherwise. Reads the
        pending resume without taking it."""
        base = self._pending_base
        if base is None:
            return None
        pending, skip, _ = self._resolve(self._pending)
        if pending is None or skip >= len(self.inner):
            return None
        return base, skip, self._pending_workers

    def position(
        self, batches_done: int, world_size: int, *, epoch_closed: bool = False
    ) -> dict[str, Any]:
        """Where the epoch stands, for the checkpoint (not ``state_dict``: Lightning would
        take a loader part with that name for a stateful loader of its own).
        ``epoch_closed``: the batches done end the epoch; a resume starts the next afresh
        (Lightning may count that epoch already, or not yet)."""
        done = int(batches_done)
        epoch = self._epoch()
        seed, batches, before = self.seed, done, 0
        holder = self._holder(done)
        if holder is not None:
            seed, batches = holder.seed, holder.start + done - holder.before
            before = holder.before - holder.start  # done before the pass began
        extra = (
            {}
            if holder is None or holder.order_state is None
            else {"order_state": holder.order_state}
        )
        return {
            **extra,
            "state_version": STATE_VERSION,
            "epoch": epoch,
            "seed": seed,
            "batches": batches,
            "world_size": int(world_size),
            "closed": bool(epoch_closed),
            "before": before,
            # ``before``: training batches of the epoch before this pass (a shorter
            # loader's earlier passes); ``batches``: where the pass stands
        }

    def script_generator_states(self) -> list[torch.Tensor]:
        """The script's own generators of this loader as they stand, for the checkpoint."""
        return [g.get_state() for g in self._script_generators]

    def restore_script_generators(self, states: Any) -> None:
        """Sets the script's generators to a checkpoint's :meth:`script_generator_states`
        (before the resumed run's first iterator: later passes draw from them)."""
        if not isinstance(states, list) or len(states) != len(self._script_generators):
            return
        for generator, state in zip(self._script_generators, states, strict=True):
            if isinstance(state, torch.Tensor):
                generator.set_state(state)

    def __iter__(self) -> Iterator[Any]:
        pending, self._pending = self._pending, None
        self._pending_base, self._pending_workers = None, None
        base_state, self.next_base_state = self.next_base_state, None
        worker_states, self.next_worker_states = self.next_worker_states, None
        replaying, self.replaying = self.replaying, False
        self.handed_out = 0
        epoch = self._epoch()
        if self._current_epoch is not None and getattr(self.sampler, "epoch", epoch) != epoch:
            # A resumed Lightning creates the epoch's iterator before it sets the samplers'
            # epoch (``FitLoop.setup_data``, then ``on_advance_start``), and workers start
            # drawing indices at once: a DistributedSampler would order by epoch 0.
            self.set_epoch(epoch)
        if self._passes_epoch != epoch:
            self._passes_epoch, self._passes = epoch, []
        if self._passes and not self._passes[-1].finished:
            # A pass left before its end within the epoch trained none of its batches:
            # in an epoch that reloads its loaders Lightning makes one iterator when it
            # builds them and another when the epoch starts; the first one's workers had
            # only prefetched (counted, they put a resume that many batches short).
            self._passes.pop()
        pending, skip, before = self._resolve(pending)
        # A generator this sampler lent an earlier pass is not the script's: that pass's
        # iterator may still be alive (in an epoch that reloads its loaders Lightning makes
        # one when it builds them and another when the epoch starts), and read as the
        # script's own, the new pass drew its order from it, advanced by the first pass
        # (measured: a resume into such an epoch with workers trained another order).
        lent = getattr(self.sampler, "generator", None)
        shuffled = isinstance(self.sampler, RandomSampler) and (
            lent is None or lent is self._order_generator
        )
        if pending is not None:
            if skip >= len(self.inner) and self._current_epoch is not None:
                # Saved after the pass's last batch in an epoch that goes on (a shorter
                # loader Lightning cycles): end this pass at once, so that Lightning
                # starts the next as the uninterrupted run did (a new iterator, which
                # draws its base seed, then this sampler's order).
                ended = _Pass(before + skip, skip, self.seed, base_state=base_state,
                              worker_states=worker_states, finished=True)  # fmt: skip
                self._passes.append(ended)
                return
            if skip >= len(self.inner):
                # Saved after the epoch's last batch (no Trainer epoch to tell): the next
                # epoch starts afresh, not a whole pass's worth of batches skipped.
                pending, before, skip = None, before + skip, 0
        order_state = pending.get("order_state") if pending is not None else None
        if self._script_order is not None and isinstance(order_state, torch.Tensor):
            self._script_order.set_state(order_state)  # the order the pass had drawn
        if pending is not None:
            self.seed = pending.get("seed")
        elif shuffled:
            # exactly what RandomSampler.__iter__ draws when it has no generator
            self.seed = int(torch.empty((), dtype=torch.int64).random_().item())
        this_pass = _Pass(
            before=before + skip,
            start=skip,
            seed=self.seed,
            base_state=base_state,
            worker_states=worker_states,
        )
        if self._script_order is not None and self._script_order is not self._order_generator:
            this_pass.order_state = self._script_order.get_state()
        self._passes.append(this_pass)
        order: torch.Generator | None = None
        if shuffled and self.seed is not None:
            assert isinstance(self.sampler, RandomSampler)
            order = torch.Generator().manual_seed(self.seed)
            self.sampler.generator = self._order_generator = order
        try:
            for index, batch in enumerate(self.inner):
                if index >= skip:
                    this_pass.yielded += 1
                    self.handed_out += 1
                    yield batch
                elif replaying:
                    self.handed_out += 1
                    yield batch  # loaded by the workers, dropped by the loader
            this_pass.finished = True
        finally:
            if order is not None and isinstance(self.sampler, RandomSampler):
                if self.sampler.generator is order:  # not a later pass's
                    self.sampler.generator = None


class ResumingStreamLoader(DataLoader):  # type: ignore[type-arg]
    """A plain ``DataLoader`` over an ``IterableDataset`` that resumes by dropping batches.

    A stream has no order to seed and no length to check, so the position is the
    epoch and the batches this process had done in it; a resume in the same epoch
    iterates the stream from its start and drops that many batches before the first
    one Lightning sees. A checkpoint from an epoch that has closed (Lightning resumes
    at the next epoch) drops nothing. The count is per process: a stream that every
    process iterates whole, or that shards itself by rank, continues where it was.

    Args:
        current_epoch: The Trainer's epoch when the stream is iterated.
        *args, **kwargs: What ``DataLoader`` takes.
    """

    def __init__(self, *args: Any, current_epoch: Callable[[], int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._current_epoch = current_epoch
        self._pending: dict[str, Any] | None = None
        self._pending_base: torch.Tensor | None = None
        self._base_state: torch.Tensor | None = None
        """The generator state this epoch's iterator drew its workers' base seed from."""

    def resume(
        self, state: dict[str, Any], world_size: int, base_state: torch.Tensor | None = None
    ) -> None:
        """Continue the epoch ``state`` describes at its next batch (on the next ``iter``);
        ``base_state`` as for :meth:`ResumingBatchSampler.resume`."""
        del world_size  # each process keeps its own count
        if state.get("state_version") == STATE_VERSION and state.get("stream") is True:
            self._pending = dict(state)
            self._pending_base = base_state if isinstance(base_state, torch.Tensor) else None

    def worker_base_state(
        self, batches_done: int, *, epoch_closed: bool = False
    ) -> torch.Tensor | None:
        """The generator state this epoch's workers were seeded from, for the checkpoint."""
        del batches_done, epoch_closed
        return self._base_state

    def position(
        self, batches_done: int, world_size: int, *, epoch_closed: bool = False
    ) -> dict[str, Any]:
        """Where the epoch stands, for the checkpoint."""
        return {
            "state_version": STATE_VERSION,
            "stream": True,
            "epoch": int(self._current_epoch()),
            "batches": int(batches_done),
            "world_size": int(world_size),
            "closed": bool(epoch_closed),
        }

    def __iter__(self) -> Any:
        pending, self._pending = self._pending, None
        base, self._pending_base = self._pending_base, None
        if (
            pending is None
            or pending.get("closed")
            or int(pending.get("epoch", -1)) != int(self._current_epoch())
        ):
            pending, base = None, None  # not resumed, or the checkpoint closed its epoch
        if self.num_workers == 0 or self.persistent_workers:
            iterator = super().__iter__()
        else:
            # the dropped batches below are loaded by the workers: their draws replay
            iterator, self._base_state = _iterator_seeded_from(self, base)
        if pending is None:
            return iterator
        for _ in range(int(pending.get("batches", 0))):
            try:
                next(iterator)
            except StopIteration:
                break  # a shorter stream than the one checkpointed: nothing left
        return iterator


class WorkerReplayingLoader(DataLoader):  # type: ignore[type-arg]
    """A ``DataLoader`` over a :class:`ResumingBatchSampler` whose workers resume their
    random draws exactly.

    Each iterator draws a base seed from ``generator`` (the global torch generator when
    ``None``) as it is created, worker ``i`` seeds torch, ``random`` and numpy from
    ``base + i`` (``torch/utils/data/_utils/worker.py``: ``_worker_loop``), and each
    worker's generators advance with every sample it loads (augmentations). Every
    iterator's generator state is kept with its pass, so a checkpoint records it; a
    resumed pass draws its base seed from that state and its workers load the batches
    the run had done (handed out in the same round-robin order) before the iterator is
    returned, which drops them: the augmentations from the first resumed batch on are
    the uninterrupted run's, at the cost of loading the skipped batches again.

    Persistent workers (``persistent_workers=True``) keep their generators from pass to
    pass, so a pass's draws depend on every batch its workers loaded before. Each worker
    reports its generators with every batch it loads (:class:`_ReportingCollate`, taken
    off the batch before Lightning sees it), and each pass keeps the workers' generators
    as it began (batches a new pass discards unseen report too:
    :class:`_PersistentWorkerLog`). A resume starts new workers from the same base seed,
    sets each one's generators to those the pass began with
    (:class:`_RestoringWorkerInit`), and drops the batches done as above.
    """

    _creation_base: torch.Tensor | None = None
    """Persistent workers: the generator state their base seed was drawn from."""
    _open: _ReportingIterator | None = None

    def __iter__(self) -> Any:
        sampler = self.batch_sampler
        if not isinstance(sampler, ResumingBatchSampler) or self.num_workers == 0:
            return super().__iter__()
        if self.persistent_workers:
            return self._persistent_iter(sampler)
        replay = sampler.worker_replay()
        base_state, drop = (replay[0], replay[1]) if replay is not None else (None, 0)
        sampler.replaying = replay is not None
        # the sampler reads the state when the iterator first draws its indices, inside
        sampler.next_base_state = base_state if base_state is not None else _seed_source(self)
        iterator, _ = _iterator_seeded_from(self, base_state)
        for _ in range(drop):
            next(iterator)
        return iterator

    def _persistent_iter(self, sampler: ResumingBatchSampler) -> Any:
        """A pass over persistent workers: new ones (the first, or a resumed, pass) start
        from the checkpoint's generators; later passes record theirs as they begin."""
        drop = 0
        log = sampler.worker_log
        if log is None:
            log = sampler.worker_log = _PersistentWorkerLog(self.num_workers)
        if getattr(self, "_iterator", None) is None:
            replay = sampler.worker_replay()
            base_state, drop, restored = replay if replay is not None else (None, 0, None)
            sampler.replaying = replay is not None
            after_closed = sampler.closed_worker_states()
            if replay is None and after_closed is not None:
                base_state, restored = after_closed  # a new pass, where the closed one ended
            self._creation_base = base_state if base_state is not None else _seed_source(self)
            log.start_workers(restored)
            sampler.next_base_state = self._creation_base
            sampler.next_worker_states = [log.known.get(w) for w in range(self.num_workers)]
            own_init = self.worker_init_fn
            if restored:
                self.worker_init_fn = _RestoringWorkerInit(own_init, restored)
            try:
                iterator, _ = _iterator_seeded_from(self, base_state)
            finally:
                self.worker_init_fn = own_init
            log.listen(iterator)
        else:
            # The sampler takes the pass's states when the iterator first draws indices,
            # inside ``__iter__``, after it has received what the workers still had
            # under way (the last pass's unfinished batches, which advanced their
            # generators): filled in once it returns, before any new batch is received.
            began: list[WorkerRng | None] = []
            sampler.next_base_state = self._creation_base
            sampler.next_worker_states = began
            iterator = DataLoader.__iter__(self)
            states = log.states_now()
            if states is None:
                sampler.forget_worker_states(began)
            else:
                began.extend(states)
        log.arrived = 0
        self._open = _ReportingIterator(iterator)
        for _ in range(drop):
            next(self._open)
        return self._open


_UNSEEN: Any = object()


def _raw_rng_state() -> RawRngState:
    """This process's generators as :data:`RawRngState`."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    return (
        torch.get_rng_state().numpy().tobytes(),
        (str(kind), np.asarray(keys, dtype=np.uint32).tobytes(), int(pos), int(has_gauss),
         float(cached)),
        (int(version), array.array("I", internal).tobytes(), gauss),
    )  # fmt: skip


def rng_state_of(raw: RawRngState | dict[str, Any]) -> dict[str, Any]:
    """``raw`` in the form the checkpoint keeps (``checkpointing.capture_rng_state``'s);
    a state already in that form is returned as it is."""
    if isinstance(raw, dict):
        return raw
    from lightning_srifty.capture.checkpointing import RNG_STATE_VERSION

    torch_bytes, (kind, keys, pos, has_gauss, cached), (version, internal, gauss) = raw
    return {
        "state_version": RNG_STATE_VERSION,
        "torch": torch.frombuffer(bytearray(torch_bytes), dtype=torch.uint8),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.frombuffer(keys, dtype=np.uint32).astype(np.int64)),
            "pos": pos,
            "has_gauss": has_gauss,
            "cached": cached,
        },
        "python": (version, tuple(array.array("I", internal)), gauss),
    }


class _PersistentWorkerLog:
    """What persistent workers reported: each one's generators after the last batch it
    loaded, and how many batches of the current pass arrived.

    Reports are read where the iterator receives each batch from the workers
    (``_MultiProcessingDataLoaderIter._get_data``), in each worker's loading order:
    batches held back for order, and those a new pass discards unseen (the last pass's
    unfinished ones: Lightning leaves a pass early in an epoch that reloads its loaders,
    or at ``limit_train_batches``), report too. Held by the loader's batch sampler, and
    by the iterator only through a weak reference: a reference cycle through the loader
    or the iterator would keep its workers alive past the script's end (joined at exit,
    never told to stop)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.known: dict[int, WorkerRng | None] = {}
        """Per worker, its generators (``None``: as its base seed left them)."""
        self.arrived = 0
        """Batches of the current pass received from the workers."""
        self.listening = False
        """Whether reports are read (``False`` on a PyTorch whose iterator differs)."""

    def start_workers(self, restored: list[dict[str, Any] | None] | None) -> None:
        """New workers: as their base seed leaves them, or as ``restored`` sets them."""
        self.known = {worker: None for worker in range(self.workers)}
        for worker, state in enumerate(restored or []):
            if worker < self.workers and state is not None:
                self.known[worker] = state
        self.arrived = 0

    def listen(self, iterator: Any) -> None:
        """Reads every report ``iterator`` receives from its workers."""
        receive = getattr(type(iterator), "_get_data", None)
        if receive is None or not callable(receive):
            self.listening = False
            return
        self.listening = True
        owner = weakref.ref(iterator)
        known = self.known
        log = weakref.ref(self)

        def get_data() -> Any:
            it = owner()
            received = receive(it)
            data = received[1] if isinstance(received, tuple) and len(received) == 2 else None
            if isinstance(data, _WithWorkerState):
                known[data.worker] = data.rng
                kept = log()
                if kept is not None:
                    kept.arrived += 1
            return received

        iterator._get_data = get_data

    def states_now(self) -> list[WorkerRng | None] | None:
        """Each worker's generators as of the batches received (``None`` where reports
        are not read)."""
        if not self.listening:
            return None
        return [self.known.get(w) for w in range(self.workers)]

    def all_arrived(self, sampler: ResumingBatchSampler) -> bool:
        """Whether every batch the pass handed out has been received: the workers then
        have nothing under way."""
        return self.listening and self.arrived == sampler.handed_out


class _WithWorkerState:
    """A batch as a persistent worker made it, with the worker's generators after it."""

    def __init__(self, batch: Any, worker: int, rng: RawRngState) -> None:
        self.batch, self.worker, self.rng = batch, worker, rng

    def pin_memory(self) -> _WithWorkerState:
        """What ``pin_memory=True`` calls: the batch pinned, as PyTorch would pin it."""
        from torch.utils.data._utils.pin_memory import pin_memory

        return _WithWorkerState(pin_memory(self.batch), self.worker, self.rng)


class _ReportingCollate:
    """The loader's ``collate_fn``, and in a worker the worker's generators after it."""

    def __init__(self, inner: Callable[[Any], Any]) -> None:
        self.inner = inner

    def __call__(self, samples: Any) -> Any:
        batch = self.inner(samples)
        info = torch.utils.data.get_worker_info()
        if info is None:
            return batch
        return _WithWorkerState(batch, int(info.id), _raw_rng_state())


class _RestoringWorkerInit:
    """A worker's ``worker_init_fn`` that then sets the worker's generators to those a
    checkpoint kept (after the script's own: its seeding ran in the run recorded too)."""

    def __init__(
        self, inner: Callable[[int], Any] | None, states: list[dict[str, Any] | None]
    ) -> None:
        self.inner, self.states = inner, states

    def __call__(self, worker_id: int) -> None:
        if self.inner is not None:
            self.inner(worker_id)
        state = self.states[worker_id] if worker_id < len(self.states) else None
        if state is not None:
            from lightning_srifty.capture.checkpointing import restore_rng_state

            restore_rng_state(state)


class _ReportingIterator:
    """A persistent-worker iterator that takes each worker's report off its batch."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __iter__(self) -> _ReportingIterator:
        return self

    def __next__(self) -> Any:
        item = next(self._inner)
        return item.batch if isinstance(item, _WithWorkerState) else item

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _saved(states: list[Any]) -> list[dict[str, Any] | None]:
    """Persistent workers' generators in the form the checkpoint keeps."""
    return [None if state is None else rng_state_of(state) for state in states]


def _split_worker_state(
    saved: Any,
) -> tuple[torch.Tensor | None, list[dict[str, Any] | None] | None]:
    """(base seed's generator state, persistent workers' generators) from what
    :meth:`ResumingBatchSampler.worker_base_state` saved."""
    if isinstance(saved, torch.Tensor):
        return saved, None
    if isinstance(saved, dict) and isinstance(saved.get("base"), torch.Tensor):
        workers = saved.get("workers")
        if isinstance(workers, list) and all(w is None or isinstance(w, dict) for w in workers):
            return saved["base"], workers
        return saved["base"], None
    return None, None


def _seed_source(loader: DataLoader) -> torch.Tensor:  # type: ignore[type-arg]
    """The state of the generator ``loader``'s next iterator draws its base seed from."""
    source = loader.generator if loader.generator is not None else torch.default_generator
    return source.get_state()


def _iterator_seeded_from(
    loader: DataLoader,  # type: ignore[type-arg]
    base_state: torch.Tensor | None,
) -> tuple[Any, torch.Tensor]:
    """``DataLoader.__iter__`` with the workers' base seed drawn from ``base_state`` (a
    copy: the loader's own generator does not move), or as usual where ``None``; and the
    state it was drawn from."""
    if base_state is None:
        state = _seed_source(loader)
        return DataLoader.__iter__(loader), state
    own, replica = loader.generator, torch.Generator()
    replica.set_state(base_state)
    loader.generator = replica
    try:
        return DataLoader.__iter__(loader), base_state
    finally:
        loader.generator = own


def _loader_kwargs(loader: DataLoader) -> dict[str, Any]:  # type: ignore[type-arg]
    """What rebuilding ``loader`` keeps, its batching aside."""
    kwargs: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    return kwargs


def make_resumable(
    loader: Any, current_epoch: Callable[[], int] | None = None
) -> DataLoader | None:  # type: ignore[type-arg]
    """A copy of a plain ``DataLoader`` that resumes at its exact batch: batches from a
    :class:`ResumingBatchSampler`, or for a stream (with ``current_epoch``) a
    :class:`ResumingStreamLoader`; ``None`` when the loader is left as it is."""
    if type(loader) is not DataLoader:
        return None
    if isinstance(loader.dataset, IterableDataset):
        if current_epoch is None:
            return None
        return ResumingStreamLoader(
            loader.dataset,
            batch_size=loader.batch_size,
            drop_last=loader.drop_last,
            current_epoch=current_epoch,
            **_loader_kwargs(loader),
        )
    if not isinstance(loader.batch_sampler, BatchSampler):
        return None
    kwargs = _loader_kwargs(loader)
    if replays_persistent_workers(loader):
        kwargs["collate_fn"] = _ReportingCollate(loader.collate_fn)
    return WorkerReplayingLoader(
        loader.dataset,
        batch_sampler=ResumingBatchSampler(
            loader.batch_sampler, current_epoch, loader_generator=loader.generator
        ),
        **kwargs,
    )


def replays_persistent_workers(loader: DataLoader) -> bool:  # type: ignore[type-arg]
    """Whether a rebuilt ``loader``'s persistent workers replay their draws on a resume:
    map-style data, handed out in order (``in_order=False`` hands batches to whichever
    worker is free)."""
    return (
        loader.num_workers > 0
        and loader.persistent_workers
        and not isinstance(loader.dataset, IterableDataset)
        and bool(getattr(loader, "in_order", True))
    )
