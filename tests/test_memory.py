"""Token pool (page aware) and the radix prefix cache (docs/sglang-rules.md §1.7, §3.1)."""

from __future__ import annotations

import pytest

from kvadmit.memory.pool import OutOfSlots, ReqSlotPool, TokenPool, new_slots
from kvadmit.memory.radix import NoPrefixCache, RadixCache, RadixNode, _common_len
from kvadmit.request import Req


def test_pool_counts_free_slots_and_reuses_freed_ones() -> None:
    pool = TokenPool(10)
    a = pool.alloc_extend([], 4)
    assert len(set(a)) == 4 and pool.available_size() == 6
    pool.free(a[:2])
    assert pool.available_size() == 8
    with pytest.raises(OutOfSlots):
        pool.alloc_extend([], 9)


def test_paged_pool_fills_the_last_page_before_taking_a_new_one() -> None:
    pool = TokenPool(16, page_size=4)
    held = pool.alloc_extend([], 5)  # one full page and one slot of a second
    assert pool.available_size() == 8  # two whole pages taken
    assert held[4] // 4 != held[0] // 4 and list(held[:4]) == list(range(held[0], held[0] + 4))
    more = pool.alloc_extend(held, 3)  # fits in the unused 3 slots of the second page
    assert pool.available_size() == 8
    assert list(more) == [held[4] + 1, held[4] + 2, held[4] + 3]
    pool.alloc_extend(held + more, 1)  # a new page
    assert pool.available_size() == 4


def test_paged_pool_size_is_whole_pages() -> None:
    assert TokenPool(4098, page_size=16).size == 4096


def test_request_slots_are_bounded() -> None:
    slots = ReqSlotPool(2)
    slots.alloc()
    slots.alloc()
    with pytest.raises(OutOfSlots):
        slots.alloc()
    slots.free()
    assert slots.available_size() == 1


def _cache(size: int = 100, page: int = 1) -> tuple[TokenPool, RadixCache]:
    pool = TokenPool(size, page)
    return pool, RadixCache(pool, page)


def _put(pool: TokenPool, cache: RadixCache, tokens: list[int]) -> int:
    return cache.insert(tokens, pool.alloc_extend([], len(tokens)))


def test_insert_reports_the_part_already_cached_and_new_tokens_are_evictable() -> None:
    pool, cache = _cache()
    assert _put(pool, cache, [1, 2, 3, 4]) == 0
    assert cache.evictable_size() == 4
    assert _put(pool, cache, [1, 2, 3, 9, 9]) == 3  # splits the first entry after 3 tokens
    assert cache.evictable_size() == 6


def test_match_returns_the_longest_prefix_and_splits_inside_a_node() -> None:
    pool, cache = _cache()
    _put(pool, cache, [1, 2, 3, 4, 5])
    m = cache.match_prefix([1, 2, 3, 7])
    assert len(m.value) == 3
    assert m.last_node.key == [1, 2, 3]
    assert cache.match_prefix([8]).last_node is cache.root


def test_match_is_page_aligned() -> None:
    pool, cache = _cache(64, page=4)
    _put(pool, cache, list(range(12)))
    assert len(cache.match_prefix(list(range(11))).value) == 8  # 11 tokens → two whole pages
    assert len(cache.match_prefix([*range(6), 99, 99]).value) == 4  # diverges inside page 2


def test_locking_a_node_protects_its_path_to_the_root() -> None:
    pool, cache = _cache()
    _put(pool, cache, [1, 2, 3])
    _put(pool, cache, [1, 2, 3, 4, 5])
    node = cache.match_prefix([1, 2, 3, 4, 5]).last_node
    cache.inc_lock_ref(node)
    assert (cache.evictable_size(), cache.protected_size()) == (0, 5)
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(node)
    assert cache.protected_size() == 5
    cache.dec_lock_ref(node)
    assert (cache.evictable_size(), cache.protected_size()) == (5, 0)


def test_evict_takes_least_recently_used_whole_leaves_and_never_locked_ones() -> None:
    pool, cache = _cache(100)
    _put(pool, cache, [1] * 1 + [10, 11, 12])  # A: 4 tokens
    _put(pool, cache, [2, 20, 21])  # B: 3 tokens
    _put(pool, cache, [3, 30])  # C: 2 tokens
    cache.match_prefix([1, 10, 11, 12])  # A becomes most recently used
    locked = cache.match_prefix([3, 30]).last_node
    cache.inc_lock_ref(locked)
    free_before = pool.available_size()
    assert cache.evict(1) == 3  # B (oldest unlocked) goes whole
    assert pool.available_size() == free_before + 3
    assert cache.evict(100) == 4  # then A; C is locked
    assert cache.evictable_size() == 0 and cache.protected_size() == 2


def test_disabled_cache_matches_nothing_and_has_nothing_evictable() -> None:
    pool = TokenPool(10)
    cache = NoPrefixCache(pool)
    assert len(cache.match_prefix([1, 2, 3]).value) == 0
    assert cache.evictable_size() == 0


def _tree(node: RadixNode) -> tuple[object, ...]:
    children = sorted((repr(k), _tree(c)) for k, c in node.children.items())
    return (node.key, list(node.value), node.lock_ref, node.last_access, children)


def _plain_cache_finished(cache: RadixCache, pool: TokenPool, req: Req) -> None:
    """cache_finished_req spelled the plain way: insert prompt + outputs from the root, then the prompt
    again (SGLang's split at the prompt's end)."""
    aligned = len(req.kv) - len(req.kv) % cache.page_size
    already = cache.insert(req.fill_ids()[:aligned], req.kv[:aligned])
    prompt = len(req.origin_input_ids) - len(req.origin_input_ids) % cache.page_size
    cache.insert(req.origin_input_ids[:prompt], req.kv[:prompt])
    if already > req.cached_len:
        pool.free(req.kv[req.cached_len : already])
    pool.free(req.kv[aligned:])
    assert req.last_node is not None
    cache.dec_lock_ref(req.last_node)


@pytest.mark.parametrize("page", [1, 4])
def test_caching_a_request_below_its_locked_node_equals_an_insert_from_the_root(page: int) -> None:
    # The request matched 8 cached tokens, computed the rest of its prompt and 6 outputs; meanwhile
    # another request cached the same prompt and 4 of those outputs. Inserting only past its locked
    # node must leave the tree (keys, slots, locks, access times), the free slots and the eviction
    # order exactly as a walk from the root does.
    def finish(shortcut: bool) -> tuple[object, ...]:
        pool, cache = _cache(200, page)
        shared = [1, 2, 3, 4, 5, 6, 7, 8]
        _put(pool, cache, shared)
        _put(pool, cache, [1, 2, 3, 4, 9, 9, 9, 9])
        req = Req(rid="a", origin_input_ids=[*shared, 10, 11, 12, 13])
        match = cache.match_prefix(req.origin_input_ids, len(req.origin_input_ids) - 1)
        cache.inc_lock_ref(match.last_node)
        req.last_node, req.kv, req.cached_len = match.last_node, match.value[:], len(match.value)
        req.kv.extend(pool.alloc_extend(req.kv, 12 - len(req.kv)))
        cache.cache_unfinished_req(req)
        for token in [20, 21, 22, 23, 24, 25]:
            req.output_ids.append(token)
            req.kv.extend(pool.alloc_extend(req.kv, 1))
        _put(pool, cache, [*req.origin_input_ids, 20, 21, 22, 23])
        if shortcut:
            cache.cache_finished_req(req)
        else:
            _plain_cache_finished(cache, pool, req)
        state = (_tree(cache.root), pool.available_size(), cache.evictable_size(), cache.protected_size())
        return state, [cache.evict(1) for _ in range(6)]

    assert finish(shortcut=True) == finish(shortcut=False)


def _retracted_request_prefilled_again(cache: RadixCache, pool: TokenPool) -> Req:
    # A retracted request: prompt of 6 and 4 outputs, nothing of it cached, prefilled again whole (10).
    req = Req(rid="r", origin_input_ids=[1, 2, 3, 4, 5, 6])
    req.output_ids.extend([7, 8, 9, 10])
    req.kv = pool.alloc_extend([], 10)
    cache.cache_unfinished_req(req)
    return req


def test_caching_past_the_prompt_splits_the_path_where_the_prompt_ends() -> None:
    # SGLang's UnifiedRadixCache inserts the prompt again after such an insert: the 10 cached tokens are
    # two nodes, the prompt's 6 and the outputs' 4. Once unlocked, evicting 1 token takes the outputs'
    # leaf (4) and the prompt stays matchable; a single 10-token node would go whole.
    pool, cache = _cache(100)
    req = _retracted_request_prefilled_again(cache, pool)
    assert [len(c.key) for c in cache.root.children.values()] == [6]
    assert cache.protected_size() == 10
    cache.release_req(req)  # retracted again: the cached 10 stay, unlocked
    assert cache.evict(1) == 4
    assert len(cache.match_prefix([1, 2, 3, 4, 5, 6, 99]).value) == 6


def test_the_split_is_at_the_page_aligned_end_of_the_prompt() -> None:
    # Page 2, a retracted request with a prompt of 5 and 4 outputs prefilled again: 9 computed, 8 cached
    # (whole pages); its prompt ends inside page 3, so the split is at 4, and evicting one page takes the
    # 4-token leaf [5, 6, 7, 8] (the prompt's fifth token and 3 outputs).
    pool, cache = _cache(100, page=2)
    req = Req(rid="r", origin_input_ids=[1, 2, 3, 4, 5])
    req.output_ids.extend([6, 7, 8, 9])
    req.kv = pool.alloc_extend([], 9)
    cache.cache_unfinished_req(req)
    cache.release_req(req)
    assert cache.evict(1) == 4 and cache.evictable_size() == 4
    assert len(cache.match_prefix([1, 2, 3, 4, 5, 6]).value) == 4


@pytest.mark.parametrize("page", [1, 4])
def test_a_key_compared_with_itself_matches_whole_pages(page: int) -> None:
    # _common_len's shortcut for a node that keeps the very list it is compared with (a finished
    # request's prompt inserted again) must give what comparing a copy token by token gives.
    key = list(range(100, 111))  # 11 tokens
    for end in (0, 3, 4, 8, 11):
        for node_key in (key, key[:5]):
            assert _common_len(node_key, key, 0, end, page) == _common_len(list(node_key), key, 0, end, page)
    assert _common_len(key, key, 0, 11, 4) == 8 and _common_len(key, key, 0, 11, 1) == 11
    assert _common_len(key, key, 2, 11, 1) == 0  # the same list, but compared from another position


def test_each_empty_slot_array_is_a_new_one() -> None:
    a, b = new_slots(), new_slots()
    a.append(7)
    assert a is not b and list(b) == [] and b.typecode == "I" and list(new_slots()) == []
    assert list(new_slots([3, 4])) == [3, 4]
