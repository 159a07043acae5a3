"""The router's approximate tree (sglang-router 0.3.2's rules, fleet/radix.py): insertion, matching,
which worker a match names, sizes, and LRU eviction, each with numbers worked out by hand."""

from __future__ import annotations

from kvadmit.fleet.radix import ApproxTree, shared_prefix


def test_shared_prefix_counts_common_leading_characters() -> None:
    assert shared_prefix("xxabcdef", 2, "abcxyz") == 3
    assert shared_prefix("abc", 0, "abcdef") == 3
    assert shared_prefix("abcdef", 0, "abc") == 3
    assert shared_prefix("q" + "a" * 999 + "b", 1, "a" * 999 + "c") == 999
    assert shared_prefix("abc", 0, "xbc") == 0


def test_a_split_node_keeps_its_creator_as_the_named_worker() -> None:
    tree = ApproxTree()
    tree.insert("abcdef", 0)
    tree.insert("abcxyz", 1)  # splits "abcdef" into "abc" (workers 0 and 1) + "def" (0), adds "xyz" (1)
    assert tree.prefix_match("abcq") == (0, 3)  # ends on "abc", created by worker 0
    assert tree.prefix_match("abcxy") == (1, 5)  # ends part-way into "xyz": its 2 matched characters count
    assert tree.prefix_match("abcdef") == (0, 6)
    assert tree.prefix_match("zzz") == (0, 0)  # the root: its first worker
    assert tree.char_count == {0: 6, 1: 6}  # 1 is on "abc" (3) and "xyz" (3)


def test_a_text_inserted_again_adds_its_worker_to_every_node_on_the_path() -> None:
    tree = ApproxTree()
    tree.insert("hello", 0)
    tree.insert("hello", 1)
    assert tree.prefix_match("hello") == (0, 5)  # the node's creator while it still holds it
    assert tree.char_count == {0: 5, 1: 5}


def test_eviction_drops_the_least_recently_used_leaves_down_to_the_size() -> None:
    tree = ApproxTree()
    tree.insert("aaaa", 0)  # epoch 0
    tree.insert("bbbbbb", 0)  # epoch 1
    tree.insert("cc", 0)  # epoch 2
    tree.insert("aaaa", 0)  # ends on the existing node: its epoch becomes 3
    tree.insert("zzzzzzzzz", 1)  # worker 1: 9 characters
    assert tree.char_count == {0: 12, 1: 9}
    tree.evict(7)
    # worker 0 (12 > 7) loses "bbbbbb" (epoch 1, the oldest): 6 ≤ 7, done; worker 1 (9 > 7) loses its leaf
    assert tree.char_count == {0: 6, 1: 0}
    assert tree.prefix_match("bbbbbb")[1] == 0
    assert tree.prefix_match("aaaa")[1] == 4 and tree.prefix_match("cc")[1] == 2
    assert tree.prefix_match("zzzzzzzzz")[1] == 0  # no worker holds it: the node is gone


def test_eviction_leaves_a_worker_at_or_under_the_size_alone() -> None:
    tree = ApproxTree()
    tree.insert("aaaa", 0)
    tree.insert("bbbb", 0)
    tree.evict(8)
    assert tree.char_count == {0: 8}
    tree.evict(7)
    assert tree.char_count == {0: 4} and tree.prefix_match("bbbb") == (0, 4)  # "aaaa" was older


def test_a_parent_left_without_children_for_a_worker_becomes_its_leaf() -> None:
    tree = ApproxTree()
    tree.insert("abcdef", 0)  # epoch 0 on the leaf
    tree.insert("abc", 0)  # splits: "abc" gets epoch 1, "def" keeps 0
    assert tree.char_count == {0: 6}
    tree.evict(2)
    # "def" (epoch 0) goes first (6 → 3), then "abc" becomes a leaf and goes too (3 → 0)
    assert tree.char_count == {0: 0}
    assert tree.prefix_match("abcdef")[1] == 0


def refreshed_by_match(matches_before: int) -> bool:
    """Whether "aaaa" survives an eviction after a match of it was the (matches_before + 3)-th operation."""
    tree = ApproxTree()
    tree.insert("aaaa", 0)  # epoch 0
    tree.insert("bbbb", 0)  # epoch 1
    for _ in range(matches_before):
        tree.prefix_match("zzz")  # epochs 2, 3, …
    tree.prefix_match("aaaa")  # epoch 2 + matches_before: refreshes "aaaa" only if divisible by 8
    tree.evict(4)
    return tree.prefix_match("aaaa")[1] == 4


def test_one_match_in_eight_refreshes_the_matched_nodes_epoch() -> None:
    assert refreshed_by_match(6)  # the match takes epoch 8: "aaaa" is now newer than "bbbb" (1)
    assert not refreshed_by_match(5)  # epoch 7: "aaaa" keeps epoch 0 and is evicted first
    assert not refreshed_by_match(7)  # epoch 9
