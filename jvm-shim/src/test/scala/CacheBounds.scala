package umjoin.spark.testkit

import org.json4s.JsonAST._
import org.json4s.jackson.JsonMethods.{compact, parse, render}

import umjoin.spark.core.LeastRecentlyUsed

/**
 * UMJoin's bounded caches (LeastRecentlyUsed), asked directly by the tests (not part of the UMJoin
 * jar). Request `{"maxEntries", "maxWeight", "steps": [[key, weight]] | [key]}`: each step with a
 * weight puts that key (weighing that much), each without one reads it; the answer is the keys
 * held after each step, least recently used first.
 */
object CacheBounds {
  def held(request: String): String = {
    val json = parse(request)
    val JInt(maxEntries) = json \ "maxEntries": @unchecked
    val JInt(maxWeight) = json \ "maxWeight": @unchecked
    val JArray(steps) = json \ "steps": @unchecked
    val cache = new LeastRecentlyUsed[String, (String, Long)](maxEntries.toInt,
      maxWeight.toLong, _._2)
    val after = steps.map { step =>
      step match {
        case JArray(List(JString(key), JInt(weight))) =>
          cache.update(key, _ => (key, weight.toLong))
        case JArray(List(JString(key))) => cache.get(key)
        case other => throw new IllegalArgumentException(s"not a step: $other")
      }
      heldKeys(cache)
    }
    compact(render(JArray(after.map(held => JArray(held.map(JString(_)).toList)))))
  }

  // The keys still held, least recently used first (read through a removeIf that removes nothing,
  // which visits them in that order without counting as a use).
  private def heldKeys(cache: LeastRecentlyUsed[String, (String, Long)]): List[String] = {
    val order = scala.collection.mutable.ArrayBuffer[String]()
    cache.removeIf { case (key, _) => order += key; false }
    order.toList
  }
}
