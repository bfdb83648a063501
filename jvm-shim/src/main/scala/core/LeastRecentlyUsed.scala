package umjoin.spark.core

/**
 * A cache that keeps at most `maxEntries` values and at most `maxWeight` of their `weight` in all,
 * dropping the least recently used past either bound (thread-safe). Only for values whose loss
 * costs time, never an answer: a value dropped is computed again.
 */
final class LeastRecentlyUsed[K, V](maxEntries: Int, maxWeight: Long = Long.MaxValue,
    weight: V => Long = (_: V) => 0L) {
  private val entries = new java.util.LinkedHashMap[K, V](16, 0.75f, true)

  def get(key: K): Option[V] = synchronized(Option(entries.get(key)))

  /** The value for `key`: `update(the value held, if any)`, kept as the most recently used. */
  def update(key: K, update: Option[V] => V): V = synchronized {
    val value = update(Option(entries.get(key)))
    entries.put(key, value)
    var total = if (maxWeight == Long.MaxValue) 0L else entries.values.stream
      .mapToLong(v => weight(v)).sum
    val eldest = entries.entrySet.iterator
    while (entries.size > 1 && (entries.size > maxEntries || total > maxWeight)) {
      total -= weight(eldest.next().getValue)
      eldest.remove()
    }
    value
  }

  def removeIf(gone: V => Boolean): Unit = synchronized(entries.values.removeIf(v => gone(v)))
}
