"""Spark-identical partitioner: ``partition_of(key, P) == pmod(hash(cols...), P)``.

Spark SQL's ``hash()`` is Murmur3 x86_32 with seed 42, applied column by
column: the hash of column i is the seed of column i+1, and a null column
leaves the running hash unchanged. Per column type (Spark's
``Murmur3HashFunction``):

- boolean      ``hashInt(1 or 0)``
- bigint       ``hashLong(v)``: low 32 bits, then high 32 bits
- double       ``hashLong(doubleToLongBits(v))``; -0.0 hashes as 0.0, and
               every NaN as the canonical NaN (``doubleToLongBits`` collapses them)
- string       ``hashUnsafeBytes`` of the UTF-8 bytes
- binary       ``hashUnsafeBytes`` of the bytes
- date         ``hashInt(days since 1970-01-01)``
- timestamp    ``hashLong(microseconds since 1970-01-01 UTC)`` (timestamp_ntz: of the wall clock)
- interval day to second  ``hashLong(microseconds)``
- decimal(p,s) p <= 18: ``hashLong(unscaled value)``; p > 18: ``hashUnsafeBytes`` of
               the unscaled value's minimal big-endian two's complement bytes

``hashUnsafeBytes`` is not standard Murmur3 (nor ``mmh3``): after the 4-byte
little-endian blocks, each of the 0..3 tail bytes is sign-extended and mixed
as a block of its own, instead of being packed into one last word. Without
tail bytes the two agree, so keys whose length is a multiple of 4 (UUIDs,
most fixed-width ids) are hashed by ``mmh3`` in C.

Python keys map to Spark types as: bool -> boolean, int -> bigint (must fit
in signed 64 bits), float -> double, str -> string, bytes/bytearray ->
binary, None -> null, tuple -> the columns in order; an aware datetime ->
timestamp, a naive one -> timestamp_ntz (both: nanoseconds truncated),
date -> date, timedelta -> interval day to second, UUID -> string (its
36-character form), Decimal -> decimal(p, s) with s its number of fraction
digits and p <= 18 exactly when it has at most 18 digits (so a Spark decimal
column of precision > 18 agrees for values of more than 18 digits; cast
narrower values to decimal(18, s)), time -> bigint of nanoseconds since
midnight (Spark 4.0 has no time type). numpy, pandas and Arrow scalars count
as their Python equivalents. Spark hashes int/smallint/tinyint columns with
``hashInt`` and float columns with ``floatToIntBits``, so a Spark job that must
agree with rockstate casts such key columns to bigint / double first.

The vectorized ``partitions_of`` computes the same thing for whole columns
with numpy on uint32 arrays (wrap-around arithmetic is Java's int arithmetic).
"""

from .columns import partitions_of, partitions_of_columns, partitions_of_packed
from .scalar import SEED, check_key, partition_of, spark_hash

__all__ = ["SEED", "check_key", "partition_of", "partitions_of", "partitions_of_columns", "partitions_of_packed", "spark_hash"]
