#pragma once
// Tar archives as WebDataset uses them: a stream of regular files, read once,
// front to back, from a file, a pipe or an HTTP body (data::ByteSource).
//
// TarReader reads the three formats writers produce: POSIX ustar (name
// prefix), GNU (long names in 'L' entries, base-256 sizes) and POSIX.1-2001
// pax (Python's tarfile, which webdataset's TarWriter uses, writes pax: 'x'
// records with `path` and `size`, 'g' global records). It returns regular
// files only; directories, links, devices and FIFOs are passed over. Every
// header's checksum is verified, every number parsed strictly, and a size
// beyond `max_member_bytes` is refused before anything is allocated, so a
// damaged or hostile archive ends in an ember::Error (kind kData) naming the
// source, the byte offset and what is wrong, never in a crash or a huge
// allocation. GNU sparse files and multi-volume archives are refused.
//
// TarWriter writes ustar headers, with a pax 'x' record for a name ustar
// cannot hold (over 100 bytes without a prefix split, or not ASCII) or a size
// of 8 GiB or more; GNU tar, Python's tarfile and webdataset read it.

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "ember/data/byte_source.h"

namespace ember::data {

/// One regular file of an archive: its name (pax `path` or GNU long name
/// applied, as stored: "./a/b.jpg" keeps its "./"), its size in bytes and the
/// byte offset of its first header in the archive.
struct TarEntry {
  std::string name;
  int64_t size = 0;
  int64_t offset = 0;
};

struct TarReaderOptions {
  /// Members larger than this are refused (before any allocation): 1 GiB.
  int64_t max_member_bytes = int64_t{1} << 30;
};

class TarReader {
 public:
  /// Reads `source` (not owned; it must outlive the reader).
  explicit TarReader(ByteSource& source, TarReaderOptions options = {});

  /// The next regular file, or nullopt at the archive's end (two zero blocks,
  /// one zero block then the end of input, or the end of input right after a
  /// member). Whatever of the previous member was not read is skipped.
  std::optional<TarEntry> next();
  /// The current member's bytes (all of them; once per member).
  std::string read();
  /// Bytes of the archive consumed so far.
  int64_t position() const { return position_; }

 private:
  bool read_block(char* block, bool allow_end);              // false: end of input at a block boundary
  void read_exact(char* out, int64_t n);                     // n bytes or a "truncated" error
  void skip(int64_t n);                                      // n bytes, read and dropped
  std::string read_payload(int64_t size, const char* what);  // a GNU long name or pax record
  [[noreturn]] void fail(int64_t offset, const std::string& what) const;

  ByteSource& source_;
  TarReaderOptions options_;
  int64_t position_ = 0;
  int64_t unread_ = 0;   // bytes of the current member not yet consumed
  int64_t padding_ = 0;  // zero bytes after them up to the block boundary
  bool member_read_ = true;
  bool ended_ = false;
};

/// Writes a tar archive to `path` (ustar, with pax records where ustar cannot
/// say it). Writes go to `path` + ".partial"; finish() pads the archive with
/// two zero blocks, flushes and fsyncs it and renames it to `path`, so a
/// reader never sees a half-written archive under the final name. A writer
/// destroyed before finish() removes the partial file.
class TarWriter {
 public:
  explicit TarWriter(std::string path);
  ~TarWriter();
  TarWriter(const TarWriter&) = delete;
  TarWriter& operator=(const TarWriter&) = delete;

  /// Appends a regular file (mode 0644, mtime `mtime` seconds since 1970).
  void add(std::string_view name, std::string_view bytes, int64_t mtime = 0);
  /// Finishes the archive and publishes it under its name.
  void finish();
  /// Bytes written so far (headers, data and padding).
  int64_t bytes() const { return bytes_; }
  /// zlib's CRC-32 of those bytes (after finish(): of the whole archive).
  uint32_t crc32() const { return crc_; }

 private:
  void write(const char* data, size_t n);

  std::string path_;
  std::string partial_;
  std::FILE* file_ = nullptr;
  int64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

}  // namespace ember::data
