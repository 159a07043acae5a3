"""Radix prefix cache over token ids, holding pool slots (SGLang's RadixCache semantics, docs/sglang-rules.md
§1.7).

Contract, in short:
* A node's `value` lists the pool slots of its `key` tokens. The cache owns those slots: they are freed
  only by `evict` (or `reset`).
* `evictable_size()` counts tokens in nodes nobody locks; `protected_size()` those locked. Locking a node
  locks its whole path to the root (`inc_lock_ref` / `dec_lock_ref`).
* Keys are matched a page at a time, so every match length is a multiple of `page_size`.
* "Time" for LRU is a counter bumped by every match and insert, never a clock.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kvadmit.memory.pool import TokenPool, new_slots


@dataclass(slots=True, eq=False)
class RadixNode:
    key: list[int]
    value: array[int]  # pool slots of the key's tokens
    parent: RadixNode | None
    children: dict[object, RadixNode]
    lock_ref: int = 0
    last_access: int = 0

    # Written out (the fields and defaults, tests/test_native_inits.py): mypyc then builds it natively.
    def __init__(
        self, key: list[int], value: array[int], parent: RadixNode | None, children: dict[object, RadixNode],
        lock_ref: int = 0, last_access: int = 0,
    ) -> None:  # fmt: skip
        self.key = key
        self.value = value
        self.parent = parent
        self.children = children
        self.lock_ref = lock_ref
        self.last_access = last_access


class CachedRequest(Protocol):
    """What the cache reads and updates on a request (the scheduler's Req is one): its tokens, the pool
    slots of those computed so far, and the cached prefix it locks. Memory knows no more of a request."""

    origin_input_ids: list[int]
    output_ids: list[int]
    kv: array[int]  # pool slots of the computed tokens, in order
    cached_len: int  # leading kv slots owned by the cache
    last_node: RadixNode | None  # the node whose lock the request holds


class MatchResult:
    """A plain class, not a NamedTuple (whose constructor is interpreted Python even when compiled)."""

    def __init__(self, value: array[int], last_node: RadixNode) -> None:
        self.value = value  # pool slots of the matched prefix (a new array)
        self.last_node = last_node  # deepest matched node (the root when nothing matched)


def _common_len(node_key: list[int], key: list[int], pos: int, end: int, page: int) -> int:
    """Length of the common prefix of node_key and key[pos:end], rounded down to a whole page."""
    n = min(len(node_key), end - pos)
    if node_key is key and pos == 0:  # the node keeps this very list (a prompt inserted again at its finish)
        return n - n % page
    part = key[pos : pos + n]  # one copy, compared at C speed (an equal prefix is the common case)
    if (node_key if len(node_key) == n else node_key[:n]) == part:
        return n - n % page
    i = 0
    while node_key[i] == part[i]:
        i += 1
    return i - i % page


class EvictionObserver(Protocol):
    """Told of every eviction pass that freed slots (a flush is not one), with its duration on the
    observer's own clock: the cache itself reads no clock."""

    def clock(self) -> float: ...

    def evicted(self, tokens: int, seconds: float) -> None: ...


class RadixCache:
    """The prefix cache. Methods that take a request update its kv / cached_len / last_node as noted."""

    enabled = True

    def __init__(self, pool: TokenPool, page_size: int = 1) -> None:
        self.pool = pool
        self.page_size = page_size
        self.eviction_observer: EvictionObserver | None = None
        self._tick = 0
        self.reset_tree()

    # ----- structure -------------------------------------------------------------------------
    def reset_tree(self) -> None:
        self.root = RadixNode(key=[], value=new_slots(), parent=None, children={}, lock_ref=1)
        self._evictable = 0
        self._protected = 0
        self._nodes = 0
        # Eviction candidates: (last_access, seq, node), pushed whenever a node may have become an
        # unlocked leaf or was touched as one; entries that no longer describe the node are skipped.
        self._heap: list[tuple[int, int, RadixNode]] = []
        self._seq = 0

    def _offer(self, node: RadixNode) -> None:
        if not node.children and node.lock_ref == 0 and node is not self.root:
            self._seq += 1
            heapq.heappush(self._heap, (node.last_access, self._seq, node))

    def reset(self) -> None:
        """Drop every cached entry, freeing its slots (flush_cache). Locked entries must not exist."""
        if self._protected:
            raise RuntimeError("cannot flush the prefix cache while requests hold locked entries")
        self._evict(self._evictable)
        self.reset_tree()

    def _child_key(self, key: list[int], pos: int = 0) -> object:
        """The children-dict key of key[pos:]: its first token, or its first page as a tuple."""
        return key[pos] if self.page_size == 1 else tuple(key[pos : pos + self.page_size])

    def _split(self, child: RadixNode, at: int) -> RadixNode:
        """Split `child` so that a new node holds its first `at` tokens; returns the new node."""
        assert child.parent is not None
        new = RadixNode(
            key=child.key[:at],
            value=child.value[:at],
            parent=child.parent,
            children={},
            lock_ref=child.lock_ref,
            last_access=child.last_access,
        )
        child.parent.children[self._child_key(new.key)] = new
        child.key = child.key[at:]
        child.value = child.value[at:]
        child.parent = new
        new.children[self._child_key(child.key)] = child
        self._nodes += 1
        return new

    # ----- queries ---------------------------------------------------------------------------
    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def match_prefix(self, key: list[int], end: int | None = None) -> MatchResult:
        """Longest cached prefix of `key[:end]` (page aligned). Splits a node the match ends inside."""
        value = new_slots()
        return MatchResult(value, self._walk(key, end, value))

    def refresh_prefix(self, key: list[int]) -> None:
        """match_prefix(key) for its effects alone (access times, the split where the match ends), as
        the waiting-prefix refresh uses it: no slots are gathered."""
        self._walk(key, None, None)

    def _walk(self, key: list[int], end: int | None, value: array[int] | None) -> RadixNode:
        """The match: the node the cached prefix of `key[:end]` ends at; its slots go to `value`."""
        self._tick += 1
        end = len(key) if end is None else min(end, len(key))
        end -= end % self.page_size  # only whole pages match
        node = self.root
        pos = 0  # key[:pos] is matched (walking an offset, not ever shorter copies of the key)
        while pos < end:
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            child.last_access = self._tick
            self._offer(child)
            n = _common_len(child.key, key, pos, end, self.page_size)
            if n == 0:
                break
            if n < len(child.key):
                child = self._split(child, n)
            if value is not None:
                value.extend(child.value)
            node = child
            pos += n
        return node

    # ----- updates ---------------------------------------------------------------------------
    def insert(self, key: list[int], value: Sequence[int]) -> int:
        """Insert key → value; returns how many leading tokens were already cached (their slots in
        `value` are now duplicates the caller must free). New tokens start unlocked (evictable)."""
        return self._insert(self.root, key, value if isinstance(value, array) else new_slots(value))[0]

    def _insert(
        self, start: RadixNode, key: list[int], value: array[int], owns_key: bool = False
    ) -> tuple[int, RadixNode, list[RadixNode]]:
        """insert() below `start`: `key` continues the tokens its path from the root spells (which a
        walk from the root would match whole, so only its nodes' access times are refreshed, in the
        walk's order). Returns how many leading tokens of `key` were already cached, the node the key
        ends at and the nodes below `start` that held that cached part (in order: their values are its
        slots). `value` may be longer than `key`; `owns_key`: a new node may keep the key list itself
        (no one changes it: node keys are replaced, never changed in place)."""
        self._tick += 1
        path: list[RadixNode] = []
        node = start
        while node is not self.root:
            assert node.parent is not None
            path.append(node)
            node = node.parent
        for node in reversed(path):
            node.last_access = self._tick
            self._offer(node)
        node = start
        pos = 0  # key[:pos] is already cached
        matched: list[RadixNode] = []
        while pos < len(key):
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            child.last_access = self._tick
            self._offer(child)
            n = _common_len(child.key, key, pos, len(key), self.page_size)
            if n == 0:
                break
            if n < len(child.key):
                child = self._split(child, n)
            pos += n
            matched.append(child)
            node = child
        if pos < len(key):
            kept = key if owns_key and pos == 0 else key[pos:]
            new = RadixNode(key=kept, value=value[pos : len(key)], parent=node, children={})
            new.last_access = self._tick
            node.children[self._child_key(new.key)] = new
            self._evictable += len(new.key)
            self._nodes += 1
            self._offer(new)
            node = new
        return pos, node, matched

    def inc_lock_ref(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            assert node.parent is not None
            node = node.parent

    def dec_lock_ref(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.lock_ref == 1:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
            node.lock_ref -= 1
            assert node.lock_ref >= 0, "radix lock released more often than taken"
            if node.lock_ref == 0:
                self._offer(node)
            assert node.parent is not None
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Evict least-recently-used unlocked leaves until at least `num_tokens` tokens are freed (or
        nothing evictable is left). Whole leaves go: the count freed may exceed the request."""
        observer = self.eviction_observer
        if observer is None:
            return self._evict(num_tokens)
        started = observer.clock()
        freed = self._evict(num_tokens)
        if freed:
            observer.evicted(freed, observer.clock() - started)
        return freed

    def _evict(self, num_tokens: int) -> int:
        if num_tokens <= 0 or self._evictable == 0:
            return 0
        if len(self._heap) > 8 * self._nodes + 64:
            self._rebuild_heap()
        heap = self._heap
        freed = 0
        while freed < num_tokens and heap:
            access, _, leaf = heapq.heappop(heap)
            if leaf.parent is None or leaf.children or leaf.lock_ref or leaf.last_access != access:
                continue  # stale: evicted, no longer a leaf, locked, or touched since
            self.pool.free(leaf.value)
            freed += len(leaf.key)
            self._evictable -= len(leaf.key)
            self._nodes -= 1
            parent = leaf.parent
            del parent.children[self._child_key(leaf.key)]
            leaf.parent = None
            self._offer(parent)
        return freed

    def _rebuild_heap(self) -> None:
        self._heap = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            self._offer(node)

    # ----- request hand-offs -----------------------------------------------------------------
    def cache_unfinished_req(self, req: CachedRequest, up_to: int | None = None) -> None:
        """After a prefill step: put the computed prompt (page aligned) in the cache and move the
        request's lock to it; the request keeps owning its unaligned tail. `up_to`: cache only the first
        so many tokens (the prefill's end: under the overlap loop the request may already hold the slot
        of its next decode step)."""
        kv_len = len(req.kv) if up_to is None else up_to
        aligned = kv_len - kv_len % self.page_size
        done = req.cached_len  # the tokens its locked node spells
        tail = _tokens(req, done, aligned)
        already, node, matched = self._insert(self._start(req), tail, req.kv[done:aligned], owns_key=True)
        # Slots [done, done + already) computed tokens another request had cached meanwhile: drop ours
        # and use the cache's.
        if already:
            self.pool.free(req.kv[done : done + already])
            cached = new_slots()
            for m in matched:
                cached.extend(m.value)
            req.kv[done : done + already] = cached
        self._split_at_prompt(req, aligned)
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(node)
        req.last_node = node
        req.cached_len = aligned

    def cache_finished_req(self, req: CachedRequest) -> None:
        """A request ended normally: cache its computed tokens (page aligned), free the rest, unlock."""
        kv_len = len(req.kv)
        aligned = kv_len - kv_len % self.page_size
        done = req.cached_len
        tail = _tokens(req, done, aligned)
        already = self._insert(self._start(req), tail, req.kv[done:aligned], owns_key=True)[0]
        if already:
            self.pool.free(req.kv[done : done + already])
        self._split_at_prompt(req, aligned)
        if kv_len > aligned:
            self.pool.free(req.kv[aligned:])
        self._unlock(req)

    def _split_at_prompt(self, req: CachedRequest, inserted: int) -> None:
        """SGLang's UnifiedRadixCache, after caching a request's first `inserted` tokens past its prompt
        (a finished request, a retracted one prefilled again with its outputs), inserts the (page
        aligned) prompt once more: the path splits where the prompt ends, so eviction can take the
        outputs and keep the prompt, and the prompt's nodes are the most recently used."""
        prompt = req.origin_input_ids
        end = len(prompt) - len(prompt) % self.page_size
        if 0 < end < inserted:
            # the whole path is cached now, so no node is made and `req.kv` only stands for the value
            self._insert(self.root, prompt if end == len(prompt) else prompt[:end], req.kv)

    def _start(self, req: CachedRequest) -> RadixNode:
        """Where inserting the request's tokens past its cached prefix starts: the node it locks, whose
        path from the root spells exactly that prefix (req.cached_len tokens)."""
        return req.last_node if req.last_node is not None else self.root

    def release_req(self, req: CachedRequest) -> None:
        """Retraction or abort: free the request's own slots without caching them; its cached prefix
        stays in the cache, unlocked (evictable)."""
        if len(req.kv) > req.cached_len:
            self.pool.free(req.kv[req.cached_len :])
        self._unlock(req)

    def _unlock(self, req: CachedRequest) -> None:
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node)
        req.last_node = None
        req.kv = new_slots()
        req.cached_len = 0


class NoPrefixCache(RadixCache):
    """`--disable-radix-cache` (SGLang's ChunkCache): nothing is shared, nothing is evictable."""

    enabled = False

    def match_prefix(self, key: list[int], end: int | None = None) -> MatchResult:
        return MatchResult(new_slots(), self.root)

    def insert(self, key: list[int], value: Sequence[int]) -> int:
        raise RuntimeError("the prefix cache is disabled")

    def cache_unfinished_req(self, req: CachedRequest, up_to: int | None = None) -> None:
        """The request keeps all its slots; a chunked prefill continues after them."""

    def cache_finished_req(self, req: CachedRequest) -> None:
        self.release_req(req)


def _tokens(req: CachedRequest, start: int, end: int) -> list[int]:
    """Tokens [start, end) of prompt + outputs, as a list a cache node may keep: a fresh copy of only
    those tokens, or the whole prompt itself (a prompt never changes, nor does a node's key)."""
    prompt = req.origin_input_ids
    if end <= len(prompt):
        return prompt if start == 0 and end == len(prompt) else prompt[start:end]
    if start >= len(prompt):
        return req.output_ids[start - len(prompt) : end - len(prompt)]
    return prompt[start:] + req.output_ids[: end - len(prompt)]
