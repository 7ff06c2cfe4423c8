// FileSystemFor (shardsafe/filesystem.h): the object store behind an s3://
// URI, one per configuration (S3Config and S3FileOptions, both from the
// environment), so that a process that changes its AWS_* variables (a test
// starting a server) gets a client for the new ones.
#include <map>
#include <mutex>

#include "s3/s3_file_system.h"

namespace shardsafe {
namespace {

// Everything that tells two configurations apart, secrets included (the
// key never leaves this process's memory).
std::string ConfigKey(const S3Config& c, const S3FileOptions& o) {
  return c.ToString() + '\0' + o.ToString() + '\0' + c.access_key_id + '\0' +
         c.secret_access_key + '\0' + c.session_token;
}

}  // namespace

Result<FileSystem*> FileSystemFor(std::string_view path, FileSystem* given) {
  if (given != nullptr) return given;
  if (!IsS3Uri(path)) return DefaultFileSystem();
  Result<S3Config> config = S3Config::FromEnvironment();
  if (!config.ok()) return config.status().WithContext(std::string(path));
  Result<S3FileOptions> options = S3FileOptions::FromEnvironment();
  if (!options.ok()) return options.status().WithContext(std::string(path));
  static std::mutex mu;
  static auto* stores = new std::map<std::string, std::unique_ptr<S3FileSystem>>;  // never freed
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<S3FileSystem>& fs = (*stores)[ConfigKey(*config, *options)];
  if (fs == nullptr) {
    SS_ASSIGN_OR_RETURN(std::unique_ptr<S3Client> client, S3Client::Create(*config));
    fs = std::make_unique<S3FileSystem>(std::move(client), *options);
  }
  return fs.get();
}

}  // namespace shardsafe
