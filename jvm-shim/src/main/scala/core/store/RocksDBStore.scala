package umjoin.spark.core.store

import java.io.File
import java.nio.ByteBuffer
import java.nio.file.Files

import org.apache.commons.io.FileUtils
import org.rocksdb.{BlockBasedTableConfig, BloomFilter, CompactionStyle, LRUCache, Options,
  ReadOptions, RocksDB, RocksIterator, Statistics, TickerType, WriteBatch, WriteOptions}

import org.apache.spark.TaskContext
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{UnsafeRow, XXH64}
import org.apache.spark.unsafe.Platform

/**
 * A store in RocksDB, the LSM-tree of UMJoin (paper 000, 3.1.2): writes go to an active memtable (a
 * skip list), which becomes read-only and is flushed to level-0 SST files when full; compaction
 * merges them into larger levels. Reads look in the memtables, then in the LRU block cache, then on
 * disk, where each SST file's bloom filter skips files without the key.
 *
 * Entry key: 8-byte hash of the join key | 4-byte key length | join key bytes | 8-byte sequence
 * number (one entry per row); value: the row's UnsafeRow bytes. The hash is the prefix RocksDB's
 * bloom filters index, and a probe is a seek to hash|length|key followed by a scan of that prefix.
 */
final class RocksDBStore private (val directory: File, numFields: Int, settings: RocksDBSettings)
  extends AppendableStore {
  private val statistics = new Statistics()
  private val blockCache = new LRUCache(settings.blockCacheSize)
  private val bloomFilter = Option.when(settings.bloomFilterBitsPerKey > 0)(
    new BloomFilter(settings.bloomFilterBitsPerKey.toDouble, false))
  private val tableConfig = {
    val config = new BlockBasedTableConfig().setBlockCache(blockCache).setWholeKeyFiltering(false)
    bloomFilter.foreach(config.setFilterPolicy)
    config
  }
  private val options = new Options()
    .setCreateIfMissing(true)
    .setWriteBufferSize(settings.writeBufferSize)
    .setMaxWriteBufferNumber(2) // the active memtable, and a read-only one being flushed
    .setCompactionStyle(CompactionStyle.LEVEL)
    .useFixedLengthPrefixExtractor(8)
    .setTableFormatConfig(tableConfig)
    .setStatistics(statistics)
  private val db = RocksDB.open(options, directory.getPath)
  // The store lives as long as its task; a crash loses nothing that was not already lost.
  private val writeOptions = new WriteOptions().setDisableWAL(true)
  private val readOptions = new ReadOptions().setPrefixSameAsStart(true)
  private val batch = new WriteBatch()
  private var cursor: RocksIterator = _
  private var sequence = 0L
  private var keyBuffer = new Array[Byte](64)
  private val row = new UnsafeRow(numFields)

  override def isEmpty: Boolean = sequence == 0
  override def keyCount: Long = sequence

  override def add(key: UnsafeRow, value: UnsafeRow): Unit =
    add(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes, value.getBaseObject,
      value.getBaseOffset, value.getSizeInBytes)

  /** Adds one row given as raw memory (e.g. moved out of a BytesToBytesMap). */
  def add(keyBase: AnyRef, keyOffset: Long, keyLength: Int, valueBase: AnyRef, valueOffset: Long,
      valueLength: Int): Unit = {
    closeIterator()
    val entryKey = new Array[Byte](prefixLength(keyLength) + 8)
    writePrefix(entryKey, keyBase, keyOffset, keyLength)
    ByteBuffer.wrap(entryKey, prefixLength(keyLength), 8).putLong(sequence)
    val value = new Array[Byte](valueLength)
    Platform.copyMemory(valueBase, valueOffset, value, Platform.BYTE_ARRAY_OFFSET, valueLength)
    batch.put(entryKey, value)
    sequence += 1
    if (batch.count() >= 1024) writeBatch()
  }

  override def get(key: UnsafeRow): Iterator[InternalRow] = {
    if (cursor == null) {
      writeBatch()
      cursor = db.newIterator(readOptions) // sees every row added so far
    }
    val length = prefixLength(key.getSizeInBytes)
    if (keyBuffer.length < length) keyBuffer = new Array[Byte](length)
    writePrefix(keyBuffer, key.getBaseObject, key.getBaseOffset, key.getSizeInBytes)
    val target = java.util.Arrays.copyOf(keyBuffer, length)
    cursor.seek(target)
    new Iterator[InternalRow] {
      override def hasNext: Boolean = cursor.isValid && startsWith(cursor.key, target)
      override def next(): InternalRow = {
        val bytes = cursor.value()
        row.pointTo(bytes, bytes.length)
        cursor.next()
        row
      }
    }
  }

  override def sizeInBytes: Long = memtableBytes + diskBytes
  def memtableBytes: Long =
    atClose.map(_._1).getOrElse(db.getLongProperty("rocksdb.cur-size-all-mem-tables"))
  def diskBytes: Long =
    atClose.map(_._2).getOrElse(db.getLongProperty("rocksdb.total-sst-files-size"))
  def blockCacheHits: Long =
    atClose.map(_._3).getOrElse(statistics.getTickerCount(TickerType.BLOCK_CACHE_HIT))
  def blockCacheMisses: Long =
    atClose.map(_._4).getOrElse(statistics.getTickerCount(TickerType.BLOCK_CACHE_MISS))

  // The figures at close (memtable, disk, cache hits, misses): native objects cannot be asked once
  // closed.
  private var atClose : Option[(Long, Long, Long, Long)] = None

  /** Frees the native memory and deletes the directory; closing again does nothing. */
  override def close(): Unit = if (atClose.isEmpty) {
    atClose = Some((memtableBytes, diskBytes, blockCacheHits, blockCacheMisses))
    closeIterator()
    Seq(batch, readOptions, writeOptions, db, options, blockCache, statistics).foreach(_.close())
    bloomFilter.foreach(_.close())
    FileUtils.deleteDirectory(directory)
  }

  private def writeBatch(): Unit = if (batch.count() > 0) {
    db.write(writeOptions, batch)
    batch.clear()
  }

  private def closeIterator(): Unit = if (cursor != null) {
    cursor.close()
    cursor = null
  }

  private def prefixLength(keyLength: Int): Int = 8 + 4 + keyLength

  private def writePrefix(target: Array[Byte], keyBase: AnyRef, keyOffset: Long,
      keyLength: Int): Unit = {
    val buffer = ByteBuffer.wrap(target)
    buffer.putLong(XXH64.hashUnsafeBytes(keyBase, keyOffset, keyLength, 42L))
    buffer.putInt(keyLength)
    Platform.copyMemory(keyBase, keyOffset, target, Platform.BYTE_ARRAY_OFFSET + 12, keyLength)
  }

  private def startsWith(bytes: Array[Byte], prefix: Array[Byte]): Boolean =
    bytes.length == prefix.length + 8 &&
      java.util.Arrays.equals(bytes, 0, prefix.length, prefix, 0, prefix.length)
}

object RocksDBStore {
  RocksDB.loadLibrary()

  /**
   * Store directories start with this JVM's host and process id, so a later JVM can tell whose they
   * are.
   */
  private val owner: String = {
    val host = java.net.InetAddress.getLocalHost.getHostName.replaceAll("[^A-Za-z0-9.]", "_")
    s"$host-pid${ProcessHandle.current().pid()}-"
  }
  private val OwnerName = """(.+)-pid(\d+)-.*""".r

  /**
   * An empty store in a new directory under `settings.root`, named after its JVM, task and input;
   * closed and deleted when the task ends (succeeds, fails or is killed). A JVM killed outright (an
   * executor lost to SIGKILL or the OOM killer) cannot delete its stores: the next store created on
   * the same host removes those of JVMs that no longer run.
   */
  def create(settings: RocksDBSettings, numFields: Int, input: Int,
      context: TaskContext): RocksDBStore = {
    val root = settings.root
    if (!root.isDirectory && !root.mkdirs() && !root.isDirectory) {
      throw new IllegalStateException(s"UMJoin cannot create its store directory $root" +
        "; set spark.umjoin.rocksdb.localDir to a writable directory")
    }
    removeStoresOfEndedProcesses(root)
    val directory = Files.createTempDirectory(root.toPath,
      s"${owner}stage${context.stageId()}-part${context.partitionId()}-attempt" +
        s"${context.attemptNumber()}-input$input-").toFile
    new RocksDBStore(directory, numFields, settings)
  }

  private def removeStoresOfEndedProcesses(root: File): Unit = {
    val host = owner.substring(0, owner.indexOf("-pid"))
    for (entry <- Option(root.listFiles()).getOrElse(Array.empty[File])) entry.getName match {
      case OwnerName(`host`, pid) =>
        val process = ProcessHandle.of(pid.toLong)
        if (!(process.isPresent && process.get.isAlive)) FileUtils.deleteQuietly(entry)
      case _ =>
    }
  }
}
