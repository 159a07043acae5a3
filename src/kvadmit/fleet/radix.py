"""The router's approximate radix tree (sglang-router 0.3.2, `policies/tree.rs`), written from its rules.

One tree per model holds the text of every request routed, character by character; each node records, for
every worker ("tenant") whose requests passed through it, an epoch: 0 for a node the tenant only passed
through, a fresh one where one of its requests ended. The epoch counter counts every insertion and every
match (the router's global counter: one tree per model, one model here).

* insert(text, tenant): walk down; split a node where the text parts from it (the upper half keeps the
  node's tenants and epochs); add the tenant (epoch 0) to every node passed; the rest becomes a new leaf
  with a fresh epoch, or, if the text ends inside the tree, the node it ends at gets a fresh epoch.
* prefix_match(text): walk down while the text matches, counting matched characters (a partly matched
  node counts its matched part and ends the walk); the answer's tenant is the node's `last_tenant` (the one
  that created it) while it is still there, else the first of the node's tenants (SGLang's hash-map order;
  here the order they were added). One match in eight (epoch % 8 == 0) refreshes that tenant's epoch.
* evict(max_size): every tenant holding more than max_size characters loses its least recently used leaves
  (lowest epoch first; ties in the order they were found, which SGLang leaves to its heap) until it is at
  or under max_size; a node no tenant holds is removed, and a parent left a leaf joins the queue.

Sizes count characters of the nodes a tenant is on (`tenant_char_count`).
"""

from __future__ import annotations

import heapq
import itertools


class _Node:
    __slots__ = ("children", "last_tenant", "parent", "tenants", "text")

    def __init__(self, text: str, parent: _Node | None, last_tenant: int | None = None) -> None:
        self.children: dict[str, _Node] = {}
        self.text = text
        self.tenants: dict[int, int] = {}  # tenant -> epoch of its last access
        self.parent = parent
        self.last_tenant = last_tenant


def shared_prefix(text: str, start: int, other: str) -> int:
    """How many characters text[start:] and other have in common from their starts (slices compared in C,
    bisecting on the length)."""
    n = min(len(text) - start, len(other))
    if text[start : start + n] == other[:n]:
        return n
    lo, hi = 0, n  # text[start:start+lo] == other[:lo]; they differ within the first hi characters
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if text[start : start + mid] == other[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class ApproxTree:
    def __init__(self) -> None:
        self.root = _Node("", None)
        self.char_count: dict[int, int] = {}  # tenant -> characters of the nodes it is on
        self.epoch = 0

    def _next_epoch(self) -> int:
        e = self.epoch
        self.epoch += 1
        return e

    def insert(self, text: str, tenant: int) -> None:
        self.root.tenants.setdefault(tenant, 0)
        count = self.char_count
        count.setdefault(tenant, 0)
        prev, pos, end = self.root, 0, len(text)
        while pos < end:
            first = text[pos]
            child = prev.children.get(first)
            if child is None:
                leaf = _Node(text[pos:], prev, tenant)
                leaf.tenants[tenant] = self._next_epoch()
                count[tenant] += end - pos
                prev.children[first] = leaf
                return
            shared = shared_prefix(text, pos, child.text)
            if shared < len(child.text):  # the text leaves this node part-way: split it
                upper = _Node(child.text[:shared], prev, child.last_tenant)
                upper.tenants = dict(child.tenants)
                child.text = child.text[shared:]
                child.parent = upper
                upper.children[child.text[0]] = child
                prev.children[first] = upper
                child = upper
            if tenant not in child.tenants:
                count[tenant] += shared
                child.tenants[tenant] = 0
            prev, pos = child, pos + shared
        prev.tenants[tenant] = self._next_epoch()  # the text ends at this node

    def prefix_match(self, text: str) -> tuple[int | None, int]:
        """(the tenant of the deepest node reached, characters matched)."""
        node, pos, end = self.root, 0, len(text)
        while pos < end:
            child = node.children.get(text[pos])
            if child is None:
                break
            shared = shared_prefix(text, pos, child.text)
            pos += shared
            node = child
            if shared < len(child.text):
                break
        tenant = node.last_tenant
        if tenant is None or tenant not in node.tenants:
            tenant = next(iter(node.tenants), None)
            node.last_tenant = tenant
        epoch = self._next_epoch()
        if epoch & 7 == 0 and tenant is not None:
            node.tenants[tenant] = epoch
        return tenant, pos

    def evict(self, max_size: int) -> None:
        count = self.char_count
        if all(size <= max_size for size in count.values()):
            return  # SGLang walks the tree and pops every leaf, but evicts nothing: skip the walk
        order = itertools.count()
        heap: list[tuple[int, int, int, _Node]] = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for tenant in _leaf_tenants(node):
                heap.append((node.tenants[tenant], next(order), tenant, node))
        heapq.heapify(heap)
        while heap:
            _, _, tenant, node = heapq.heappop(heap)
            if count.get(tenant, 0) <= max_size:
                continue
            if tenant not in node.tenants or any(tenant in c.tenants for c in node.children.values()):
                continue  # no longer this tenant's leaf
            count[tenant] = max(0, count[tenant] - len(node.text))
            del node.tenants[tenant]
            parent = node.parent
            if parent is None:
                continue
            if not node.children and not node.tenants and node.text:
                del parent.children[node.text[0]]
            if tenant in parent.tenants and not any(tenant in c.tenants for c in parent.children.values()):
                heapq.heappush(heap, (parent.tenants[tenant], next(order), tenant, parent))

    def size(self, tenant: int) -> int:
        return self.char_count.get(tenant, 0)


def _leaf_tenants(node: _Node) -> list[int]:
    """The tenants on this node that none of its children has."""
    below: set[int] = set()
    for child in node.children.values():
        below.update(child.tenants)
    return [t for t in node.tenants if t not in below]
