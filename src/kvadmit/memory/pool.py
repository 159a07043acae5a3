"""Token-slot allocator (page aware) and the request-slot pool.

The KV pool has `size` token slots grouped in pages of `page_size` slots. Slot ids are what the real
executor indexes its KV tensors with; the scheduler only needs their count. A request grows its KV by
first filling the unused slots of its last page, then taking whole new pages, as SGLang's paged allocator
does, so a request always holds whole pages and `available_size()` is a multiple of the page size.

Slot lists (a request's KV, a cache entry's value, the free list) are C arrays of unsigned 32-bit ints,
not lists of Python ints: they are copied, handed over and freed by the thousand tokens, and an array
moves bytes where a list would touch every int object it refers to. (Typecode "I": unlike the signed
codes, its append converts an int without parsing a format string, as fast as a list's append.)
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from typing import Final

from kvadmit.memory.errors import OutOfSlots

SLOT_TYPECODE = "I"
MAX_SLOTS = 1 << (8 * array(SLOT_TYPECODE).itemsize)  # slot ids must fit the array's items


def new_slots(values: Iterable[int] | None = None) -> array[int]:
    """A slot list: an unsigned-int array (empty, or holding `values`). An empty one is a copy of an empty
    array (the array type's constructor parses its arguments: about 1,500 instructions where a copy takes
    a tenth; a fleet run makes one or more for every step)."""
    return _EMPTY[:] if values is None else array(SLOT_TYPECODE, values)


_EMPTY: Final = array(SLOT_TYPECODE)  # never changed: only copied


# 0, 1, 2, …: a pool's never-used pages are handed out as slices of it, a memory copy, where extending a
# slot array from a range converts every int (a fleet's replicas spend their first thousands of requests
# taking fresh pages). Shared by every pool, grown by doubling up to the largest id asked for.
_COUNTING: list[array[int]] = [new_slots()]


def _counting(start: int, stop: int) -> array[int]:
    """The slot array [start, stop)."""
    ids = _COUNTING[0]
    if stop > len(ids):
        ids = _COUNTING[0] = new_slots(range(min(max(stop, 2 * len(ids)), MAX_SLOTS)))
    return ids[start:stop]


# 0, 0, 0, …: what an anonymous pool hands out (grown like _COUNTING).
_BLANK: list[array[int]] = [new_slots()]


def blank_slots(n: int) -> array[int]:
    """A slot array of n zeros: the slots of an anonymous pool, which counts slots and names none."""
    zeros = _BLANK[0]
    if n > len(zeros):
        zeros = _BLANK[0] = new_slots(bytes(max(n, 2 * len(zeros)) * zeros.itemsize))  # (bytes: raw items)
    return zeros[:n]


def pages_for(tokens: int, page_size: int) -> int:
    """Whole pages that hold `tokens` tokens: ⌈tokens / page_size⌉ (floor division of the negation
    rounds toward −∞, so negating it back rounds up)."""
    return -(-tokens // page_size)


def ceil_page(tokens: int, page_size: int) -> int:
    """`tokens` rounded up to whole pages (what `tokens` slots take from a paged pool)."""
    return -(-tokens // page_size) * page_size


class TokenPool:
    """Free pages kept as a stack; pages never handed out yet come from a counter (cheap to build).
    Every method that hands out slots returns a new slot array the caller owns.

    An anonymous pool (page size 1, `make_anonymous`) only counts: every slot it hands out is 0 and a
    freed slot is a number returned. For a simulation, where nothing reads a slot id (the scheduler's rules
    read only how many slots a request, the cache and the pool hold)."""

    __slots__ = ("_fresh", "_returned", "anonymous", "num_pages", "page_size", "size")

    def __init__(self, size: int, page_size: int = 1) -> None:
        if size <= 0 or page_size <= 0:
            raise ValueError(f"pool size and page size must be positive, got {size} and {page_size}")
        if size > MAX_SLOTS:
            raise ValueError(f"a pool of {size} tokens is more than the {MAX_SLOTS} slot ids can number")
        self.page_size = page_size
        self.num_pages = size // page_size
        self.size = self.num_pages * page_size
        self._fresh = 0  # pages [_fresh, num_pages) were never allocated (anonymous: slots in use)
        self._returned = new_slots()  # freed page ids, reused last-in first-out (anonymous: empty)
        self.anonymous = False

    def make_anonymous(self) -> None:
        """Count slots from now on rather than name them (page size 1, before any slot is handed out)."""
        if self.page_size != 1 or self._fresh or self._returned:
            raise ValueError("only an unused pool of page size 1 can be made anonymous")
        self.anonymous = True

    def available_size(self) -> int:
        """Free token slots (whole free pages × page size)."""
        return (len(self._returned) + self.num_pages - self._fresh) * self.page_size

    def _take_pages(self, n: int) -> array[int]:
        if n <= 0:
            return new_slots()  # (and never slice [-0:], which would be the whole free list)
        if self.anonymous:
            self.take_count(n)
            return blank_slots(n)
        if n > len(self._returned) + self.num_pages - self._fresh:
            raise OutOfSlots(f"asked for {n} pages, {self.available_size() // self.page_size} free")
        returned = self._returned
        if not returned:
            taken = _counting(self._fresh, self._fresh + n)
            self._fresh += n
            return taken
        k = min(n, len(returned))
        taken = returned[-k:]
        del returned[-k:]
        if n > k:
            taken.extend(_counting(self._fresh, self._fresh + n - k))
            self._fresh += n - k
        return taken

    def pages_needed(self, held: int, extra: int) -> int:
        """New pages a request holding `held` slots needs to grow by `extra` tokens."""
        p = self.page_size
        room = (-held) % p  # unused slots left in its last page
        # pages_for written out: a decode step at page size > 1 asks this for every running request, and
        # the extra call cost ~50 ns of ~350 here.
        return -(-max(extra - room, 0) // p)

    def alloc_extend(self, held: Sequence[int], extra: int) -> array[int]:
        """Slots for `extra` more tokens of a request that already holds `held` (in order)."""
        if extra <= 0:
            return new_slots()
        p = self.page_size
        if p == 1:
            return self._take_pages(extra)
        room = (-len(held)) % p
        slots = new_slots()
        if room:
            last = held[-1]
            slots.extend(range(last + 1, last + 1 + min(room, extra)))
        for page in self._take_pages(self.pages_needed(len(held), extra)):
            slots.extend(range(page * p, page * p + p))
        return slots[:extra]

    def take_count(self, count: int) -> None:
        """An anonymous pool: `count` slots in use from now on (what alloc_decode hands out, unnamed)."""
        if count > self.num_pages - self._fresh:
            raise OutOfSlots(f"asked for {count} pages, {self.available_size()} free")
        self._fresh += count

    def alloc_decode(self, count: int) -> array[int]:
        """One slot each for `count` requests at page size 1 (the common decode case, one slice)."""
        return self._take_pages(count)

    def free(self, slots: Sequence[int]) -> None:
        """Return the pages of these slots. With paging, pass every slot of a page you give up."""
        if self.anonymous:
            self._fresh -= len(slots)
            return
        if self.page_size == 1:
            self._returned.extend(slots)
            return
        p = self.page_size
        pages = sorted({s // p for s in slots})
        self._returned.extend(pages)

    def clear(self) -> None:
        self._fresh = 0  # (an anonymous pool stays anonymous)
        self._returned = new_slots()


class ReqSlotPool:
    """Request slots (SGLang's req-to-token pool): one per running or chunked request."""

    __slots__ = ("_used", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._used = 0

    def available_size(self) -> int:
        return self.size - self._used

    def alloc(self, n: int = 1) -> None:
        if n > self.size - self._used:
            raise OutOfSlots(f"asked for {n} request slots, {self.size - self._used} free")
        self._used += n

    def free(self, n: int = 1) -> None:
        if n > self._used:
            raise ValueError(f"freeing {n} request slots but only {self._used} are in use")
        self._used -= n
