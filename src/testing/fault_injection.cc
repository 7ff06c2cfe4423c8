// FaultInjectingFileSystem: counting, arming, and the wrapped WritableFile.
//
// Arming records an absolute target ("fail when the counter of this kind
// reaches `at`"), so counting stays a single increment under the lock.
#include "testing/fault_injection.h"

namespace shardsafe {
namespace {

// Routes each call through BeforeOp() first; skips the base on failure.
class FaultInjectingFile final : public WritableFile {
 public:
  FaultInjectingFile(FaultInjectingFileSystem* fs, std::unique_ptr<WritableFile> base)
      : fs_(fs), base_(std::move(base)) {}

  Status Append(const void* data, size_t n) override {
    SS_RETURN_IF_ERROR(fs_->BeforeOp(OpKind::kAppend));
    return base_->Append(data, n);
  }
  Status AppendStable(const void* data, size_t n) override {
    SS_RETURN_IF_ERROR(fs_->BeforeOp(OpKind::kAppend));
    return base_->AppendStable(data, n);
  }
  Status AppendChecksummed(const void* data, size_t n, uint32_t* crc) override {
    SS_RETURN_IF_ERROR(fs_->BeforeOp(OpKind::kAppend));
    return base_->AppendChecksummed(data, n, crc);
  }
  Status AppendFilled(uint64_t bytes, const Filler& fill, uint32_t* crc) override {
    SS_RETURN_IF_ERROR(fs_->BeforeOp(OpKind::kAppend));
    return base_->AppendFilled(bytes, fill, crc);
  }
  Status WaitStable() override { return base_->WaitStable(); }
  Status Sync() override {
    SS_RETURN_IF_ERROR(fs_->BeforeOp(OpKind::kSync));
    return base_->Sync();
  }
  Status Close() override {
    SS_RETURN_IF_ERROR(fs_->BeforeOp(OpKind::kClose));
    return base_->Close();
  }
  uint64_t size() const override { return base_->size(); }

 private:
  FaultInjectingFileSystem* const fs_;
  std::unique_ptr<WritableFile> base_;
};

}  // namespace

std::string_view OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kCreate: return "create";
    case OpKind::kAppend: return "append";
    case OpKind::kSync: return "sync";
    case OpKind::kClose: return "close";
    case OpKind::kRename: return "rename";
    case OpKind::kSyncDir: return "syncdir";
    case OpKind::kCreateDir: return "createdir";
    case OpKind::kRemove: return "remove";
  }
  return "unknown";
}

int64_t FaultInjectingFileSystem::count(OpKind kind) const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_[static_cast<int>(kind)];
}

int64_t FaultInjectingFileSystem::total_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

int64_t FaultInjectingFileSystem::injected_failures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return injected_;
}

void FaultInjectingFileSystem::FailNth(OpKind kind, int64_t n, Status error) {
  std::lock_guard<std::mutex> lock(mu_);
  const int k = static_cast<int>(kind);
  nth_[k] = Armed{counts_[k] + n, std::move(error)};
}

void FaultInjectingFileSystem::FailAfter(int64_t n, Status error) {
  std::lock_guard<std::mutex> lock(mu_);
  after_ = Armed{total_ + n, std::move(error)};
}

void FaultInjectingFileSystem::ClearFaults() {
  std::lock_guard<std::mutex> lock(mu_);
  nth_ = {};
  after_.reset();
}

void FaultInjectingFileSystem::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  nth_ = {};
  after_.reset();
  counts_ = {};
  total_ = 0;
  injected_ = 0;
}

Status FaultInjectingFileSystem::BeforeOp(OpKind kind) {
  std::lock_guard<std::mutex> lock(mu_);
  const int k = static_cast<int>(kind);
  const int64_t index = counts_[k]++;
  const int64_t overall = total_++;
  Status error;
  if (nth_[k] && nth_[k]->at == index) {
    error = nth_[k]->error;
    nth_[k].reset();
  } else if (after_ && overall >= after_->at) {
    error = after_->error;
  }
  if (!error.ok()) ++injected_;
  return error;
}

Result<std::unique_ptr<WritableFile>> FaultInjectingFileSystem::NewWritableFile(
    const std::string& path, const WriteOptions& options) {
  SS_RETURN_IF_ERROR(BeforeOp(OpKind::kCreate));
  SS_ASSIGN_OR_RETURN(auto file, base_->NewWritableFile(path, options));
  return std::unique_ptr<WritableFile>(new FaultInjectingFile(this, std::move(file)));
}

Status FaultInjectingFileSystem::CreateDir(const std::string& path) {
  SS_RETURN_IF_ERROR(BeforeOp(OpKind::kCreateDir));
  return base_->CreateDir(path);
}

Status FaultInjectingFileSystem::RemoveFile(const std::string& path) {
  SS_RETURN_IF_ERROR(BeforeOp(OpKind::kRemove));
  return base_->RemoveFile(path);
}

Status FaultInjectingFileSystem::RemoveAll(const std::string& path) {
  SS_RETURN_IF_ERROR(BeforeOp(OpKind::kRemove));
  return base_->RemoveAll(path);
}

Status FaultInjectingFileSystem::Rename(const std::string& from, const std::string& to) {
  SS_RETURN_IF_ERROR(BeforeOp(OpKind::kRename));
  return base_->Rename(from, to);
}

Status FaultInjectingFileSystem::RenameExchange(const std::string& a, const std::string& b) {
  SS_RETURN_IF_ERROR(BeforeOp(OpKind::kRename));
  return base_->RenameExchange(a, b);
}

Status FaultInjectingFileSystem::CreateFileExclusive(const std::string& path,
                                                     std::string_view data) {
  SS_RETURN_IF_ERROR(BeforeOp(OpKind::kCreate));
  return base_->CreateFileExclusive(path, data);
}

Status FaultInjectingFileSystem::ReplaceFileIfVersion(const std::string& path,
                                                      std::string_view data,
                                                      const std::optional<std::string>& version) {
  SS_RETURN_IF_ERROR(BeforeOp(OpKind::kCreate));
  return base_->ReplaceFileIfVersion(path, data, version);
}

Status FaultInjectingFileSystem::SyncDir(const std::string& path) {
  SS_RETURN_IF_ERROR(BeforeOp(OpKind::kSyncDir));
  return base_->SyncDir(path);
}

}  // namespace shardsafe
