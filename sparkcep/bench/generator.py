"""HiBench streaming input: records whose key is the send time and whose value
is a ``uservisits`` row, generated columnar (numpy + pyarrow, no Python loop
per record).

HiBench's generator (``autogen/.../streaming``) cycles over a seed file of
``uservisits`` rows and sends each to Kafka with the current time in ms as the
key and the row, cut or padded with NUL bytes to ``record_bytes - len(key)``,
as the value; every workload parses the source IP out of the value. This
module does the same without the seed file: row ``i`` of a stream is a pure
function of ``(seed, i)`` (a counter-based hash picks each field from a fixed
pool), so any slice of the stream can be made on its own, in any chunking,
and equals the same slice of any other run with that seed.

Value layout (comma-separated, as HiBench's ``UserVisitParser`` reads it)::

    sourceIP,destURL,visitDate,adRevenue,userAgent,countryCode,languageCode,searchWord,duration

>>> g = UserVisits(seed=1, distinct_ips=1000)
>>> b = g.records(0, 3, start_us=1_700_000_000_000_000, rate=1000)
>>> b.schema.names, b.num_rows
(['key', 'value'], 3)
>>> len(b.column("value")[0].as_py().encode()) + len("1700000000000")
200
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit

from sparkcep.core.hashing import mix64

RECORD_SCHEMA = pa.schema([("key", pa.timestamp("us")), ("value", pa.string())])
#: the stream's schema in sparkcep's DDL
RECORD_DDL = "key timestamp, value string"
CHUNK = 1 << 16  # rows rendered at a time into the cycle cache
KEY_DIGITS = 13  # HiBench's key: System.currentTimeMillis() as text, 13 digits until 2286

_USER_AGENTS = [
    "Mozilla/5.0 (iPhone; U; CPU like Mac OS X)AppleWebKit/420.1 (KHTML like Gecko) Version/3.0 Mobile/4A93Safari/419.3",
    "Mozilla/5.0 (Windows; U; Windows NT 5.2) AppleWebKit/525.13 (KHTML like Gecko) Chrome/0.2.149.27 Safari/525.13",
    "Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.1)",
    "Mozilla/4.0 (compatible; MSIE 7.0; Windows NT 6.0)",
    "Mozilla/5.0 (Windows; U; Windows NT 5.1; en-US; rv:1.8.1.13) Gecko/20080311 Firefox/2.0.0.13",
    "Mozilla/5.0 (Macintosh; U; Intel Mac OS X; en) AppleWebKit/522.11.1 (KHTML like Gecko) Version/3.0.3 Safari/522.12.1",
    "Opera/9.25 (Windows NT 5.1; U; en)",
    "Mozilla/5.0 (X11; U; Linux i686; en-US; rv:1.8.1.12) Gecko/20080207 Ubuntu/7.10 (gutsy) Firefox/2.0.0.12",
    "Googlebot/2.1 (+http://www.googlebot.com/bot.html)",
    "Mozilla/4.0 (compatible; MSIE 5.5; Windows NT 5.0)",
]
_COUNTRIES = ["YEM", "PRT", "DOM", "USA", "DEU", "FRA", "ESP", "ITA", "GBR", "CHN", "JPN", "IND", "BRA", "MEX",
              "CAN", "AUS", "RUS", "KOR", "NLD", "SWE", "POL", "TUR", "ARG", "ZAF", "EGY", "NGA", "KEN", "PER",
              "CHL", "COL", "VNM", "THA", "IDN", "PHL", "IRL", "NOR", "DNK", "FIN", "GRC", "AUT"]
_LANGS = ["AR", "PT", "ES", "EN", "DE", "FR", "IT", "ZH", "JA", "HI", "RU", "KO", "NL", "SV", "PL", "TR"]
_STREAMS = {"ip": 1, "url": 2, "date": 3, "rev": 4, "agent": 5, "country": 6, "lang": 7, "word": 8, "dur": 9}


def mix(seed: int, stream: int, index: np.ndarray) -> np.ndarray:
    """A uint64 pseudo-random value per index: splitmix64 of (seed, stream, index)."""
    with np.errstate(over="ignore"):
        x = index.astype(np.uint64) + np.uint64((seed * 0x9E3779B1 + stream * 0x85EBCA77) & 0xFFFFFFFFFFFFFFFF)
        return mix64(x * np.uint64(0x9E3779B97F4A7C15))


def _letters(rng: np.random.Generator, n: int, lo: int, hi: int) -> pa.Array:
    lengths = rng.integers(lo, hi + 1, n)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = rng.integers(ord("a"), ord("z") + 1, int(offsets[-1]), dtype=np.uint8)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


MAX_IPS = 1 << 22  # distinct source IPs a stream may cycle over: their pool is made up front (15 s at the most)


def ip_pool(seed: int, n: int) -> pa.Array:
    """``n`` distinct dotted IPv4 addresses (deterministic in ``seed``)."""
    rng = np.random.default_rng([seed, 0x1B])
    seen = np.zeros(0, np.uint32)
    while len(seen) < n:
        seen = np.unique(np.concatenate([seen, rng.integers(1 << 24, 0xDFFFFFFF, n, dtype=np.uint32)]))
    addr = rng.permutation(seen)[:n]
    octets = [pa.array((addr >> np.uint32(s)) & np.uint32(255)).cast(pa.string()) for s in (24, 16, 8, 0)]
    return pc.binary_join_element_wise(*octets, ".")


class UserVisits:
    """The record stream of one seed.

    ``distinct_ips``: how many source IPs the stream cycles over (the group-by
    key of wordcount and fixwindow); ``record_bytes``: key + value length, 200
    in HiBench's default configuration; ``pad``: the byte filling short values
    (NUL, as HiBench).
    """

    def __init__(self, seed: int = 0, distinct_ips: int = 100_000, record_bytes: int = 200, pad: str = "\0",
                 cycle: int = 1 << 20):
        if not 1 <= distinct_ips <= MAX_IPS:
            raise ValueError(f"distinct_ips must be from 1 to {MAX_IPS:,}, got {distinct_ips}")
        if record_bytes <= KEY_DIGITS:
            raise ValueError(f"record_bytes must exceed the {KEY_DIGITS}-byte key, got {record_bytes}")
        if cycle < 1 or cycle % CHUNK:
            raise ValueError(f"cycle must be a positive multiple of {CHUNK}, got {cycle}")
        self.seed, self.distinct_ips, self.record_bytes, self.pad = seed, distinct_ips, record_bytes, pad
        self.cycle = cycle
        self._chunks: dict[int, pa.Array] = {}
        self.value_bytes = record_bytes - KEY_DIGITS
        rng = np.random.default_rng([seed, 0x2C])
        self.ips = ip_pool(seed, distinct_ips)
        self.urls = _letters(rng, 1000, 20, 80)
        self.words = _letters(rng, 2000, 3, 12)
        self.agents = pa.array(_USER_AGENTS)
        self.countries = pa.array(_COUNTRIES)
        langs = rng.choice(_LANGS, len(_COUNTRIES))
        self.languages = pa.array([f"{c}-{l}" for c, l in zip(_COUNTRIES, langs)])
        dates = pa.array(np.arange(14_600, dtype=np.int32), pa.date32()).cast(pa.string())  # 1970 .. 2009
        revenue = pa.array((rng.random(1 << 16)).astype(np.float32)).cast(pa.string())
        durations = pa.array(np.arange(1, 11)).cast(pa.string())
        # every field is drawn from a pool; one concatenated pool feeds the render kernel
        pools = [("ip", self.ips), ("url", self.urls), ("date", dates), ("rev", revenue),
                 ("agent", self.agents), ("country", self.countries), ("lang", self.languages),
                 ("word", self.words), ("dur", durations)]
        self._pool_fields = [(name, len(p)) for name, p in pools]
        self._pool_base = np.cumsum([0] + [len(p) for _, p in pools[:-1]]).astype(np.int64)
        allp = pa.concat_arrays([p.cast(pa.string()) for _, p in pools])
        _, off, data = allp.buffers()
        self._pool_off = np.frombuffer(off, np.int32, count=len(allp) + 1).astype(np.int64)
        self._pool_data = np.frombuffer(data, np.uint8)

    # --- columns of rows [start, start+n) --------------------------------------
    def ip_index(self, start: int, n: int) -> np.ndarray:
        """Index into :attr:`ips` of each row's source IP."""
        return (mix(self.seed, _STREAMS["ip"], self._rows(start, n)) % np.uint64(self.distinct_ips)).astype(np.int64)

    def source_ips(self, start: int, n: int) -> pa.Array:
        return self.ips.take(pa.array(self.ip_index(start, n)))

    def durations(self, start: int, n: int) -> np.ndarray:
        return (mix(self.seed, _STREAMS["dur"], self._rows(start, n)) % np.uint64(10) + np.uint64(1)).astype(np.int64)

    def _rows(self, start: int, n: int) -> np.ndarray:
        return np.arange(start, start + n, dtype=np.int64) % self.cycle

    def values(self, start: int, n: int) -> pa.Array:
        """The ``value`` strings of rows ``start .. start+n-1``, cut/padded to ``value_bytes``.

        Like HiBench, which loops over a cached seed file, the stream repeats
        every :attr:`cycle` rows; rows are rendered once, CHUNK at a time, and
        then served as zero-copy slices.
        """
        parts, i, end = [], start, start + n
        while i < end:
            r = i % self.cycle
            c, o = divmod(r, CHUNK)
            if c not in self._chunks:
                self._chunks[c] = self._render(c * CHUNK, CHUNK)
            k = min(CHUNK - o, end - i)
            parts.append(self._chunks[c].slice(o, k))
            i += k
        if len(parts) == 1:
            return parts[0]
        return pa.concat_arrays(parts) if parts else pa.array([], pa.string())

    def _render(self, start: int, n: int) -> pa.Array:
        idx = np.arange(start, start + n)
        fields = np.empty((n, len(self._pool_base)), np.int64)
        for j, (stream, size) in enumerate(self._pool_fields):
            if stream == "ip":
                pick = self.ip_index(start, n)
            elif stream == "dur":
                pick = self.durations(start, n) - 1
            elif stream == "lang":
                pick = fields[:, j - 1] - self._pool_base[j - 1]  # the country's language
            else:
                pick = (mix(self.seed, _STREAMS[stream], idx) % np.uint64(size)).astype(np.int64)
            fields[:, j] = pick + self._pool_base[j]
        w = self.value_bytes
        data = np.empty(n * w, np.uint8)
        _render(data, w, ord(self.pad), self._pool_off, self._pool_data, fields)
        offsets = np.arange(0, (n + 1) * w, w, dtype=np.int64)
        typ = pa.string() if offsets[-1] < 2**31 else pa.large_string()
        off = pa.py_buffer(offsets.astype(np.int32) if typ == pa.string() else offsets)
        return pa.Array.from_buffers(typ, n, [None, off, pa.py_buffer(data)])

    def records(self, start: int, n: int, start_us: int, rate: float | None = None,
                keys: np.ndarray | None = None) -> pa.RecordBatch:
        """Rows ``start .. start+n-1`` as ``(key timestamp[us], value string)``.

        The key of row ``i`` is ``start_us + i * 1e6 / rate`` (the time it is due
        to be sent at ``rate`` records/s), or ``keys`` when given.
        """
        if keys is None:
            if not rate or rate <= 0:
                raise ValueError("records() needs a positive rate or explicit keys")
            keys = start_us + (np.arange(start, start + n, dtype=np.float64) * (1e6 / rate)).astype(np.int64)
        return pa.RecordBatch.from_arrays([pa.array(np.asarray(keys, np.int64), pa.timestamp("us")),
                                           self.values(start, n)], schema=RECORD_SCHEMA)


@njit(nogil=True, cache=True)
def _render(out, width, pad, pool_off, pool_data, fields):
    """Row i = the pool strings ``fields[i, :]`` joined by ',', cut/padded to ``width`` bytes."""
    n, m = fields.shape
    for i in range(n):
        o = i * width
        end = o + width
        for j in range(m):
            if j > 0:
                if o == end:
                    break
                out[o] = 44  # ','
                o += 1
            p = fields[i, j]
            s = pool_off[p]
            k = min(pool_off[p + 1] - s, end - o)
            for q in range(k):
                out[o + q] = pool_data[s + q]
            o += k
        for q in range(o, end):
            out[q] = pad


def key_text(keys_us: np.ndarray) -> pa.Array:
    """HiBench's key: the send time in ms as decimal text."""
    return pa.array(np.asarray(keys_us, np.int64) // 1000).cast(pa.string())
