#pragma once
// TensorBoard event files: scalars and histograms that `tensorboard --logdir`
// (and torch.utils.tensorboard's readers) display, written without Python or
// TensorFlow. Same file layout and defaults as torch.utils.tensorboard's
// SummaryWriter:
//
//   ember::monitor::TensorBoardWriter tb("runs/exp1");
//   tb.add_scalar("train/loss", loss.item<double>(), step);
//   tb.add_histogram("weights/fc1", fc1->weight, step);
//
// No dependency beyond LibTorch: Ember encodes the few protobuf messages of an
// event file itself.

#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>

namespace ember::monitor {

struct TensorBoardOptions {
  /// Seconds between writes of buffered records to the file (10, as
  /// SummaryWriter's flush_secs); 0 writes every record at once. Checked on each
  /// add_*, with no background thread: flush() or destruction writes the rest.
  /// Buffered records are also written whenever they reach 1 MiB.
  TORCH_ARG(double, flush_seconds) = 10.0;
  /// Appended to the event file name, like SummaryWriter's filename_suffix ("").
  TORCH_ARG(std::string, filename_suffix);
};

/// Writes one TensorBoard event file. Records are TFRecord-framed serialized
/// `Event` protos (length, masked CRC-32C of the length, payload, masked
/// CRC-32C of the payload), as TensorFlow and torch write them. Calls from
/// several threads are serialized by an internal mutex.
///
/// Write errors (disk full, the file or its folder deleted) throw ember::Error
/// from the call that writes (an add_* that flushes, or flush()); the writer is
/// then closed and every later call throws. The destructor flushes too, but can
/// only print its error to stderr: call flush() last to get it as an exception.
class TensorBoardWriter {
 public:
  /// Creates `log_dir` and its parents and the file
  ///   <log_dir>/events.out.tfevents.<unix seconds, 10 digits>.<hostname>.<pid>.<n><suffix>
  /// with n = 0, or the next free number if that name exists (never
  /// overwrites), and writes its first event, file_version "brain.Event:2".
  /// Throws ember::Error when the folder or file cannot be created.
  explicit TensorBoardWriter(const std::string& log_dir, TensorBoardOptions options = {});
  /// Flushes (errors go to stderr) and closes the file.
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// Logs `value` (stored as float32, TensorBoard's simple_value) under `tag`
  /// at `step`, with wall time now.
  void add_scalar(const std::string& tag, double value, int64_t step);
  /// The same with the given wall time (seconds since the Unix epoch).
  void add_scalar(const std::string& tag, double value, int64_t step, double wall_time);

  /// Logs a histogram of the values of `values` (any shape, device and real or
  /// bool dtype; detached) under `tag` at `step`, with wall time now. The same
  /// histogram as SummaryWriter.add_histogram(tag, values, step) with its default
  /// bins="tensorflow": bucket edges 0 and +-1e-12 * 1.1^k up to 1e20, kept from
  /// the bucket left of the first non-empty one to the last non-empty one.
  /// Computed on the tensor's device in float64; one copy of ~12 KiB to the host.
  ///
  /// NaN and +-inf are skipped: num, min, max, sum and sum_squares are those of
  /// the finite values (torch would fold them into min/max/sum); all values
  /// non-finite gives an empty histogram (num 0, no buckets). Finite values
  /// beyond +-1e20 count in num, min, max and sums but in no bucket, as in torch.
  /// Throws ember::Error for an empty or complex tensor.
  void add_histogram(const std::string& tag, const torch::Tensor& values, int64_t step);

  /// Writes every buffered record to the file (write(2); no fsync: TensorBoard
  /// reads the file while it grows). Throws ember::Error on a write failure or
  /// when the file has been deleted since it was opened.
  void flush();

  /// The event file's path.
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::monitor
