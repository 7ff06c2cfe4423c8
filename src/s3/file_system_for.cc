// FileSystemFor (shardsafe/filesystem.h): the object store behind an s3://
// URI, one per configuration, so that a process that changes its AWS_*
// variables (a test starting a server) gets a client for the new ones.
#include <map>
#include <mutex>

#include "s3/s3_file_system.h"

namespace shardsafe {
namespace {

// Everything that tells two configurations apart, secrets included (the
// key never leaves this process's memory).
std::string ConfigKey(const S3Config& c) {
  return c.ToString() + '\0' + c.access_key_id + '\0' + c.secret_access_key + '\0' +
         c.session_token;
}

}  // namespace

Result<FileSystem*> FileSystemFor(std::string_view path, FileSystem* given) {
  if (given != nullptr) return given;
  if (!IsS3Uri(path)) return DefaultFileSystem();
  SS_ASSIGN_OR_RETURN(S3Config config, S3Config::FromEnvironment());
  static std::mutex mu;
  static auto* stores = new std::map<std::string, std::unique_ptr<S3FileSystem>>;  // never freed
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<S3FileSystem>& fs = (*stores)[ConfigKey(config)];
  if (fs == nullptr) {
    SS_ASSIGN_OR_RETURN(std::unique_ptr<S3Client> client, S3Client::Create(config));
    fs = std::make_unique<S3FileSystem>(std::move(client), S3FileOptions());
  }
  return fs.get();
}

}  // namespace shardsafe
