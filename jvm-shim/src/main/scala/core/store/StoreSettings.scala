package umjoin.spark.core.store

import java.io.File

import org.apache.spark.SparkEnv

/** Where UMJoin keeps the stores its tasks build. */
sealed trait StateBackend

object StateBackend {
  /**
   * Spark's in-memory hash map; a store that does not fit fails the task, as Spark's hash joins do.
   */
  case object Memory extends StateBackend
  /** RocksDB (an LSM-tree) under the task's local directory. */
  case object RocksDB extends StateBackend
  /** In memory while the task memory manager grants memory, then moved to RocksDB. */
  case object Auto extends StateBackend

  val byName: Map[String, StateBackend] =
    Map("memory" -> Memory, "rocksdb" -> RocksDB, "auto" -> Auto)
}

/**
 * The LSM-tree's knobs, per store: `writeBufferSize` is one memtable (a skip list; one more may be
 * read-only while it is flushed), `blockCacheSize` the LRU cache of SST blocks read from disk,
 * `bloomFilterBitsPerKey` the size of the key filters (0: none).
 */
final case class RocksDBSettings(writeBufferSize: Long, blockCacheSize: Long,
    bloomFilterBitsPerKey: Int, localDir: Option[String]) {

  /**
   * The directory stores are created under: the setting, else the first local directory Spark's own
   * block manager uses, looked up in Spark's order: the container's directories on YARN, the
   * application's directories a standalone worker gives its executors, SPARK_LOCAL_DIRS,
   * spark.local.dir, the JVM's temporary directory. Cluster managers delete the first three with
   * the application.
   */
  def root: File = {
    val env = sys.env
    val yarn = if (env.contains("CONTAINER_ID")) env.get("LOCAL_DIRS").map(_.split(",")) else None
    val base = localDir.getOrElse(
      yarn
        .orElse(env.get("SPARK_EXECUTOR_DIRS").map(_.split(File.pathSeparator)))
        .orElse(env.get("SPARK_LOCAL_DIRS").map(_.split(",")))
        .getOrElse(Option(SparkEnv.get).flatMap(_.conf.getOption("spark.local.dir"))
          .getOrElse(System.getProperty("java.io.tmpdir")).split(","))
        .head)
    new File(base, "umjoin-stores")
  }
}

/**
 * @param maxStoreMemory with `auto`, a store also moves to RocksDB once its in-memory size passes
 *                       this many bytes (None: only when Spark's memory manager refuses memory)
 */
final case class StoreSettings(backend: StateBackend, rocksdb: RocksDBSettings,
    maxStoreMemory: Option[Long])
