// The WritableFile of S3FileSystem: one object written as a multipart
// upload (s3_file_system.h states the contract). Internal to src/s3.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "s3/s3_client.h"
#include "shardsafe/filesystem.h"

namespace shardsafe {

class S3WritableFile : public WritableFile {
 public:
  S3WritableFile(S3Client& client, S3Location at, size_t part_bytes, int in_flight,
                 ThreadPool& pool);
  ~S3WritableFile() override;

  Status Append(const void* data, size_t n) override;
  Status AppendChecksummed(const void* data, size_t n, uint32_t* crc) override;
  Status Sync() override;
  Status Close() override;
  uint64_t size() const override { return size_; }

 private:
  struct Part {
    std::vector<char> bytes;
    uint32_t crc = 0;
  };
  // Copies into the part being filled, starting an upload whenever it is full.
  Status Fill(const char* data, size_t n, uint32_t* crc);
  // Uploads `part_` as the next part (creating the upload first), waiting
  // while `in_flight_` parts are already on their way.
  Status ShipPart();
  Status WaitForUploads();
  Status FirstError();
  // Aborts an open upload (best effort).
  void Abandon();

  S3Client& client_;
  const S3Location at_;
  const size_t part_bytes_;
  const int max_in_flight_;
  ThreadPool& pool_;

  Part part_;
  uint64_t size_ = 0;
  std::optional<std::string> upload_id_;
  int next_part_ = 1;
  bool synced_ = false;
  bool closed_ = false;

  std::mutex mu_;
  std::condition_variable cv_;
  int in_flight_ = 0;
  std::vector<CompletedPart> done_;  // guarded by mu_
  Status error_;                     // guarded by mu_: the first failed part
};

}  // namespace shardsafe
