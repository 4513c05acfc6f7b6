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
