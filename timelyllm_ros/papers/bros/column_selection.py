"""BROS's batch selection on request columns: `selection.select_batch` without a Python object
per request.

An admission pass offers the selection every queued generation - hundreds to thousands under
overload - but its two packing loops stop after at most `batch_limit + 1` RT and as many BE
requests. What `select_batch` does for every request before the loops (slack, the price of each
RT request alone, the late test, Tres, the two sorts) is done here on numpy columns, with the
same float operations in the same order, elementwise, so every value and every comparison is bit
for bit the one `select_batch` makes; the loops then run in Python on the heads of the two
sorted queues only. `test/unit/papers/test_bros_column_selection.py` checks that both give the
same selection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

from timelyllm_ros.papers.bros.cost_model import BrosCostModel
from timelyllm_ros.papers.bros.requests import BE, RT, TIME_TOLERANCE_S, BrosRequest
from timelyllm_ros.papers.bros.selection import Selection, SlotOracle, can_defer


@dataclass(frozen=True)
class RequestColumns:
    """`BrosRequest` fields as columns, one row per request (see `BrosRequest` for what each
    means). Row order is the callers' order: `select_batch(rt, be)` with `rt` and `be` the RT
    and BE rows, in row order, is what `select_columns` computes."""

    req_ids: Sequence[Hashable]
    is_rt: np.ndarray            # bool: RT, else BE
    prefill: np.ndarray          # bool
    new_tokens: np.ndarray       # int64
    context_tokens: np.ndarray   # int64
    t_since_token_s: np.ndarray  # float64
    tokens_left: np.ndarray      # int64, >= 1
    slo_s: np.ndarray            # float64
    host_slots: np.ndarray       # int64

    def __post_init__(self) -> None:
        n = len(self.req_ids)
        columns = (self.is_rt, self.prefill, self.new_tokens, self.context_tokens,
                   self.t_since_token_s, self.tokens_left, self.slo_s, self.host_slots)
        if any(len(c) != n for c in columns):
            raise ValueError("request columns must all have one row per request")
        if n and (self.new_tokens.min() < 0 or self.context_tokens.min() < 0
                  or self.host_slots.min() < 0):
            raise ValueError("token counts must be >= 0")
        if n and self.tokens_left.min() < 1:
            raise ValueError("tokens_left must be >= 1")

    def __len__(self) -> int:
        return len(self.req_ids)

    @classmethod
    def from_requests(cls, requests: Sequence[BrosRequest]) -> "RequestColumns":
        return cls(
            req_ids=[r.req_id for r in requests],
            is_rt=np.array([r.kind == RT for r in requests], dtype=bool),
            prefill=np.array([r.prefill for r in requests], dtype=bool),
            new_tokens=np.array([r.new_tokens for r in requests], dtype=np.int64),
            context_tokens=np.array([r.context_tokens for r in requests], dtype=np.int64),
            t_since_token_s=np.array([r.t_since_token_s for r in requests], dtype=np.float64),
            tokens_left=np.array([r.tokens_left for r in requests], dtype=np.int64),
            slo_s=np.array([r.slo_s for r in requests], dtype=np.float64),
            host_slots=np.array([r.host_slots for r in requests], dtype=np.int64))

    def request(self, row: int) -> BrosRequest:
        """Row `row` as a `BrosRequest` (for inspection; the selection never builds one)."""
        return BrosRequest(self.req_ids[row], kind=RT if self.is_rt[row] else BE,
                           prefill=bool(self.prefill[row]),
                           new_tokens=int(self.new_tokens[row]),
                           context_tokens=int(self.context_tokens[row]),
                           t_since_token_s=float(self.t_since_token_s[row]),
                           tokens_left=int(self.tokens_left[row]), slo_s=float(self.slo_s[row]),
                           host_slots=int(self.host_slots[row]))

    def slack(self, rows: np.ndarray, t_avg_s: float) -> np.ndarray:
        """`BrosRequest.slack` of the given rows (the same operations, elementwise)."""
        return (self.slo_s[rows] - self.t_since_token_s[rows]
                - (self.tokens_left[rows] - 1) * t_avg_s)


@dataclass(frozen=True)
class ColumnSelection:
    """`Selection` as row indices of `requests` (each list in `Selection`'s order)."""

    requests: RequestColumns
    rt: list[int]
    be: list[int]
    rt_queue: list[int]
    be_queue: list[int]
    displaced: list[int]
    tres_s: float
    hit: bool
    est_iter_s: float
    late_served: int

    @property
    def batch(self) -> list[int]:
        return self.rt + self.be

    def to_selection(self) -> Selection:
        """The same selection with a `BrosRequest` per row, as `select_batch` returns it."""
        def objects(rows: list[int]) -> list[BrosRequest]:
            return [self.requests.request(i) for i in rows]
        return Selection(rt=objects(self.rt), be=objects(self.be),
                         rt_queue=objects(self.rt_queue), be_queue=objects(self.be_queue),
                         displaced=objects(self.displaced), tres_s=self.tres_s, hit=self.hit,
                         est_iter_s=self.est_iter_s, late_served=self.late_served)


class _Head:
    """The first rows of a sorted queue as Python lists: the loops index them one request at a
    time, and a numpy scalar per access would cost more than the loop body."""

    def __init__(self, requests: RequestColumns, rows: np.ndarray):
        self.rows = rows.tolist()
        self.req_ids = [requests.req_ids[i] for i in self.rows]
        self.prefill = requests.prefill[rows].tolist()
        self.new_tokens = requests.new_tokens[rows].tolist()
        self.context_tokens = requests.context_tokens[rows].tolist()
        self.host_slots = requests.host_slots[rows].tolist()
        self.slots_needed = [n + h for n, h in zip(self.new_tokens, self.host_slots)]

    def __len__(self) -> int:
        return len(self.rows)

    def fields(self, i: int) -> tuple[bool, int, int, int]:
        """What the running price needs of entry i (`ModelCostAccumulator.add`)."""
        return self.prefill[i], self.new_tokens[i], self.context_tokens[i], self.host_slots[i]


def select_columns(requests: RequestColumns, *, cost: BrosCostModel, t_avg_s: float,
                   batch_limit: int, blocks: SlotOracle | None = None,
                   token_budget: int | None = None) -> ColumnSelection:
    """`select_batch` of the RT and BE rows of `requests`: the same selection, as row indices.
    Every step below mirrors one of `select_batch`; see it for the why of each rule."""
    if batch_limit < 1:
        raise ValueError(f"batch_limit must be >= 1, got {batch_limit}")
    if not isinstance(cost, BrosCostModel):
        raise TypeError(f"select_columns prices with a BrosCostModel, got {type(cost).__name__}")
    t_avg_s = float(t_avg_s)
    rt_rows = np.flatnonzero(requests.is_rt)
    be_rows = np.flatnonzero(~requests.is_rt)

    slack = requests.slack(rt_rows, t_avg_s)
    alone = cost.alone_s(requests.prefill[rt_rows], requests.new_tokens[rt_rows],
                         requests.context_tokens[rt_rows], requests.host_slots[rt_rows])
    late = slack + TIME_TOLERANCE_S < alone
    feasible = slack[~late]
    if np.isnan(slack).any():
        # NaN compares false both ways, so Python's sort and min then depend on the order of
        # their input, and numpy's do not follow them: use Python's, on the same floats.
        keys = slack.tolist()
        order = np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.intp)
        tres = min(feasible.tolist()) if feasible.size else math.inf
    else:
        order = np.argsort(slack, kind="stable")  # stable: equal slack keeps row order
        tres = float(feasible.min()) if feasible.size else math.inf

    acc = cost.accumulator()
    claimed_rt = 0
    claimed_be = 0
    budget_left = math.inf if token_budget is None else int(token_budget)

    # RT loop. It stops at the latest when batch_limit requests are chosen, so it reads at most
    # batch_limit + 1 of the sorted RT queue.
    rt_head_order = order[:batch_limit + 1]
    rt_head = _Head(requests, rt_rows[rt_head_order])
    rt_slack = slack[rt_head_order].tolist()
    rt_late = late[rt_head_order].tolist()
    chosen_rt: list[int] = []  # entries of rt_head
    hit = False
    late_served = 0
    for i in range(len(rt_head)):
        if (len(chosen_rt) >= batch_limit
                or (blocks is not None and rt_head.slots_needed[i]
                    > blocks.rt_capacity(rt_head.req_ids[i]) - claimed_rt)
                or rt_head.new_tokens[i] > budget_left):
            break
        acc.add(*rt_head.fields(i), 1)
        if rt_late[i] and len(chosen_rt) == late_served:
            late_served += 1
        elif acc.value() > tres + TIME_TOLERANCE_S:
            acc.add(*rt_head.fields(i), -1)
            hit = True
            break
        chosen_rt.append(i)
        claimed_rt += rt_head.slots_needed[i]
        budget_left -= rt_head.new_tokens[i]
    taken_rt = len(chosen_rt)  # the RT loop takes a prefix of the sorted queue
    if late_served and not feasible.size:
        tres = acc.value()

    # BE loop: resident requests by host slots, then waiting prefills (stable). Each pass
    # through it that does not stop adds a BE request to a batch that never exceeds
    # batch_limit, so it reads at most batch_limit + 1 of the sorted BE queue.
    be_order = be_rows[np.lexsort((requests.host_slots[be_rows], requests.prefill[be_rows]))]
    be_head = _Head(requests, be_order[:batch_limit + 1])
    chosen_be: list[int] = []  # entries of be_head
    displaced: list[int] = []  # entries of rt_head
    for i in range(len(be_head)):
        if ((blocks is not None and be_head.slots_needed[i]
                > blocks.be_capacity(be_head.req_ids[i]) - claimed_rt - claimed_be)
                or be_head.new_tokens[i] > budget_left):
            break
        n = len(chosen_rt) + len(chosen_be)
        acc.add(*be_head.fields(i), 1)
        if n + 1 <= batch_limit and acc.value() <= tres + TIME_TOLERANCE_S:
            chosen_be.append(i)
        else:
            if not chosen_rt:
                acc.add(*be_head.fields(i), -1)
                break
            r = chosen_rt[-1]
            acc.add(*rt_head.fields(r), -1)
            est = acc.value()
            if (n <= batch_limit and est <= tres + TIME_TOLERANCE_S
                    and can_defer(rt_slack[r], est, t_avg_s)):
                chosen_rt.pop()
                claimed_rt -= rt_head.slots_needed[r]
                budget_left += rt_head.new_tokens[r]
                displaced.append(r)
                chosen_be.append(i)
            else:
                acc.add(*be_head.fields(i), -1)
                acc.add(*rt_head.fields(r), 1)
                break
        claimed_be += be_head.slots_needed[i]
        budget_left -= be_head.new_tokens[i]

    est = acc.value() if (chosen_rt or chosen_be) else 0.0
    # Displaced requests went back to the head of the RT queue, the last one displaced first.
    rt_queue = ([rt_head.rows[r] for r in reversed(displaced)]
                + rt_rows[order[taken_rt:]].tolist())
    return ColumnSelection(
        requests=requests, rt=[rt_head.rows[r] for r in chosen_rt],
        be=[be_head.rows[b] for b in chosen_be], rt_queue=rt_queue,
        be_queue=be_order[len(chosen_be):].tolist(),
        displaced=[rt_head.rows[r] for r in displaced], tres_s=tres, hit=hit, est_iter_s=est,
        late_served=late_served)
