#pragma once
// Sequential byte sources: where a shard's bytes come from.
//
// A ByteSource is read once, front to back. FileSource reads a local file
// (SSD, NFS), PipeSource a command's output. Errors are ember::Error of kind
// kData naming the source.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ember::data {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  /// Reads up to `n` bytes into `buffer`; returns how many, 0 only at the end.
  virtual size_t read(char* buffer, size_t n) = 0;
  /// Skips up to `n` bytes; returns how many (fewer only at the end). By
  /// default reads them; a file seeks.
  virtual int64_t skip(int64_t n);
  /// Where the bytes come from, for messages: a path, a URL, "pipe:COMMAND".
  virtual const std::string& name() const = 0;
};

/// A local file, read with read(2) (the kernel's read-ahead told the access is sequential).
class FileSource : public ByteSource {
 public:
  explicit FileSource(std::string path);
  /// The file's size when opened.
  int64_t size() const { return size_; }
  ~FileSource() override;
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;
  size_t read(char* buffer, size_t n) override;
  int64_t skip(int64_t n) override;
  const std::string& name() const override { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;  // at open
  int64_t position_ = 0;
};

/// The standard output of `sh -c COMMAND`: webdataset's "pipe:COMMAND", how
/// its users read object storage ("pipe:aws s3 cp s3://bucket/shard.tar -",
/// "pipe:gsutil cat gs://bucket/shard.tar"). The command's standard error
/// goes to a temporary file; at the end of its output its exit status is
/// checked, and a non-zero status is an error (kData) quoting the command,
/// the status and the end of its standard error. Destroyed before the end
/// of output, the command is stopped (SIGTERM) and reaped.
class PipeSource : public ByteSource {
 public:
  explicit PipeSource(std::string command);
  ~PipeSource() override;
  PipeSource(const PipeSource&) = delete;
  PipeSource& operator=(const PipeSource&) = delete;
  size_t read(char* buffer, size_t n) override;
  const std::string& name() const override { return name_; }

 private:
  void reap();  // waits for the command; throws on a non-zero status

  std::string command_;
  std::string name_;  // "pipe:COMMAND"
  int pid_ = -1;
  int out_ = -1;  // read end of its standard output
  int err_ = -1;  // its standard error, a temporary file
};

/// How HttpSource retries.
struct HttpOptions {
  /// Attempts after the first, for a transport error (refused, reset, cut
  /// short), a stall, or an HTTP status 408, 429 or 5xx. Other statuses
  /// (404, 403...) are not retried: the server's answer would not change.
  int retries = 5;
  /// The wait before the first retry; it doubles for each next one, up to 30 s.
  double backoff_seconds = 0.5;
  int connect_timeout_seconds = 30;
  /// Under one byte a second for this long: a stall, retried. (libcurl
  /// averages the speed over its last 5 seconds, so a stall is seen about
  /// 6 s after this.)
  int stall_seconds = 60;
};

/// An http(s):// URL, through libcurl (loaded when the first one is opened,
/// so libember runs without it until then). A retry resumes where the body
/// stopped (an HTTP Range request; a server that ignores Range sends the
/// body again and the part already read is dropped), so the bytes read are
/// those of one whole transfer. When the retries are spent, the error (kData)
/// names the URL, the HTTP status or the transport error, the attempts and
/// the byte it stopped at. Memory: at most 8 MiB received ahead of read().
class HttpSource : public ByteSource {
 public:
  HttpSource(std::string url, HttpOptions options = {});
  ~HttpSource() override;
  HttpSource(const HttpSource&) = delete;
  HttpSource& operator=(const HttpSource&) = delete;
  size_t read(char* buffer, size_t n) override;
  const std::string& name() const override { return url_; }

 private:
  struct Transfer;
  void start(int64_t offset);  // a new attempt, from byte `offset`
  void pump();                 // runs the transfer a little; retries or fails an ended attempt

  std::string url_;
  HttpOptions options_;
  std::unique_ptr<Transfer> transfer_;
  std::string range_;  // "OFFSET-", alive while its attempt runs
  int attempts_ = 0;   // failed attempts so far
};

/// Another source, with the CRC-32 (zlib's) and count of every byte that
/// passes: what a manifest's checksum is checked against. Skips read.
class ChecksumSource : public ByteSource {
 public:
  explicit ChecksumSource(ByteSource& inner) : inner_(inner) {}
  size_t read(char* buffer, size_t n) override;
  int64_t skip(int64_t n) override { return ByteSource::skip(n); }
  const std::string& name() const override { return inner_.name(); }
  /// Reads what is left, to the end.
  void drain();
  uint32_t crc32() const { return crc_; }
  int64_t bytes() const { return bytes_; }

 private:
  ByteSource& inner_;
  uint32_t crc_ = 0;
  int64_t bytes_ = 0;
};

/// Bytes held in memory (tests, fuzzing, a shard already fetched).
class MemorySource : public ByteSource {
 public:
  MemorySource(std::string bytes, std::string name) : bytes_(std::move(bytes)), name_(std::move(name)) {}
  size_t read(char* buffer, size_t n) override;
  const std::string& name() const override { return name_; }

 private:
  std::string bytes_;
  std::string name_;
  size_t at_ = 0;
};

}  // namespace ember::data
