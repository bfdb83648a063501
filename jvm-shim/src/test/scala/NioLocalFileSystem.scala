package umjoin.spark.testkit

import java.nio.file.Files
import java.nio.file.attribute.PosixFilePermissions

import org.apache.hadoop.fs.{LocalFileSystem, Path, RawLocalFileSystem}
import org.apache.hadoop.fs.permission.FsPermission

/**
 * Hadoop's local file system with permissions set through java.nio instead of a `chmod` process.
 * Without Hadoop's native library (pyspark ships none) every file or directory Hadoop creates with a
 * permission starts one: a random chain of the streaming tests started about 3,500 for its
 * checkpoints (state store deltas and changelogs, offsets, commits, schemas) and output files.
 * The same bits are set; what Spark and UMJoin write and read is unchanged. The tests' session
 * takes it as `fs.file.impl` (tests/conftest.py).
 */
final class NioLocalFileSystem extends LocalFileSystem(new NioRawLocalFileSystem)

final class NioRawLocalFileSystem extends RawLocalFileSystem {
  override def setPermission(path: Path, permission: FsPermission): Unit =
    if (permission.getStickyBit) super.setPermission(path, permission)
    else {
      val symbolic = Seq(permission.getUserAction, permission.getGroupAction, permission.getOtherAction).map(_.SYMBOL).mkString
      Files.setPosixFilePermissions(pathToFile(path).toPath, PosixFilePermissions.fromString(symbolic))
    }
}
