// The S3 client tests' servers: moto (tests/s3/moto_server.py) and the
// fault-injecting proxy in front of it (tests/s3/fault_proxy.py), each a
// python3 child process of the test, and a fixture that starts both, makes
// a client of the proxy and creates a bucket with it.
//
// A missing python3 or moto fails the test (never skips it): the child's
// stderr shows why and the test sees its stdout close without a port.
// Waits are on the children's output, with generous deadlines, never on
// time alone.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "s3/s3_client.h"
#include "testing/storage_test_util.h"

extern char** environ;

namespace shardsafe::testing {

inline ::testing::AssertionResult IsOk(const Status& s) {
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << s.ToString();
}
template <typename T>
::testing::AssertionResult IsOk(const Result<T>& r) {
  return IsOk(r.status());
}
#define S3_ASSERT_OK(expr) ASSERT_TRUE(::shardsafe::testing::IsOk(expr))
#define S3_EXPECT_OK(expr) EXPECT_TRUE(::shardsafe::testing::IsOk(expr))

// tests/s3/NAME in the source tree (this header is src/testing/s3_test_util.h).
inline std::string S3TestScript(const std::string& name) {
  std::filesystem::path here = std::filesystem::weakly_canonical(__FILE__);
  return (here.parent_path().parent_path().parent_path() / "tests" / "s3" / name).string();
}

// `python3 SCRIPT ARGS...` with stdin and stdout piped to the test; stderr
// is the test's. Killed (SIGKILL) and reaped when destroyed.
class PythonProcess {
 public:
  PythonProcess(const std::string& script, const std::vector<std::string>& args) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return;
    std::vector<std::string> argv_s = {"python3", script};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addclose(&actions, in[1]);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    if (posix_spawnp(&pid_, "python3", &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
  }
  ~PythonProcess() {
    if (stdin_ >= 0) close(stdin_);
    if (stdout_ >= 0) close(stdout_);
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  PythonProcess(const PythonProcess&) = delete;
  PythonProcess& operator=(const PythonProcess&) = delete;

  bool started() const { return pid_ > 0; }

  // The next line of its stdout; Unavailable when it closes or nothing
  // comes for `timeout_ms` (generous: a stuck child, not a slow one).
  Result<std::string> ReadLine(int timeout_ms = 120000) {
    while (true) {
      size_t nl = buffered_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buffered_.substr(0, nl);
        buffered_.erase(0, nl + 1);
        return line;
      }
      pollfd p{stdout_, POLLIN, 0};
      if (poll(&p, 1, timeout_ms) != 1) return UnavailableError("no output from the child");
      char chunk[4096];
      ssize_t n = read(stdout_, chunk, sizeof(chunk));
      if (n <= 0) return UnavailableError("the child closed its stdout (see its stderr above)");
      buffered_.append(chunk, static_cast<size_t>(n));
    }
  }

  Status WriteLine(const std::string& line) {
    std::string s = line + "\n";
    if (write(stdin_, s.data(), s.size()) != static_cast<ssize_t>(s.size())) {
      return UnavailableError("cannot write to the child");
    }
    return Status::Ok();
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
  std::string buffered_;
};

// The first line of `process`: its port and what follows, split at spaces.
inline Result<std::vector<std::string>> ReadReadyLine(PythonProcess& process,
                                                      const std::string& what) {
  if (!process.started()) return UnavailableError("cannot start python3 for " + what);
  Result<std::string> line = process.ReadLine();
  if (!line.ok()) return line.status().WithContext(what + " did not start");
  std::istringstream in(*line);
  std::vector<std::string> fields;
  for (std::string f; in >> f;) fields.push_back(f);
  if (fields.empty()) return UnavailableError(what + " printed an empty line");
  return fields;
}

// One request as the proxy logged it (fault_proxy.py's log format).
struct ProxyRequest {
  std::string method, target, client_port, action;
  uint64_t body_bytes = 0;
  std::string body_file, crc32c, content_sha256, signed_headers, header_names;
};

inline ProxyRequest ParseProxyLine(const std::string& line) {
  std::vector<std::string> f;
  std::istringstream in(line);
  for (std::string field; std::getline(in, field, '\t');) f.push_back(field);
  f.resize(11);
  return {f[1], f[2], f[3], f[4], std::strtoull(f[5].c_str(), nullptr, 10),
          f[6], f[7], f[8], f[9], f[10]};
}

// moto behind the fault proxy, and a client of the proxy that has created
// kBucket. Retries are fast (1-4 ms) so that fault tests take no time.
// Without --auth the proxy checks every request's signature against the
// client's secret (fault_proxy.py --secret); with it, moto does.
class S3ServerTest : public ::testing::Test {
 protected:
  static constexpr char kBucket[] = "shardsafe-test";

  void SetUp() override { StartServers({}); }

  // Starts moto (with `moto_args`), the proxy and a client with the
  // credentials of TestConfig, or of moto's IAM user under --auth.
  void StartServers(const std::vector<std::string>& moto_args) {
    ASSERT_TRUE(bodies_.ok());
    moto_ = std::make_unique<PythonProcess>(S3TestScript("moto_server.py"), moto_args);
    Result<std::vector<std::string>> moto = ReadReadyLine(*moto_, "moto (moto_server.py)");
    S3_ASSERT_OK(moto);
    moto_fields_ = *moto;
    std::vector<std::string> proxy_args = {(*moto)[0], bodies_.path()};
    S3Config config = TestConfig("");
    if (moto_fields_.size() >= 3) {  // --auth: moto's IAM user
      config.access_key_id = moto_fields_[1];
      config.secret_access_key = moto_fields_[2];
    } else {
      proxy_args.insert(proxy_args.end(), {"--secret", config.secret_access_key});
    }
    proxy_ = std::make_unique<PythonProcess>(S3TestScript("fault_proxy.py"), proxy_args);
    Result<std::vector<std::string>> proxy = ReadReadyLine(*proxy_, "fault_proxy.py");
    S3_ASSERT_OK(proxy);
    config_ = config;
    config_.endpoint = "http://127.0.0.1:" + (*proxy)[0];
    Result<std::unique_ptr<S3Client>> client = S3Client::Create(config_);
    S3_ASSERT_OK(client);
    client_ = std::move(*client);
    S3_ASSERT_OK(client_->CreateBucket(kBucket));
  }

  static S3Config TestConfig(const std::string& endpoint) {
    S3Config c;
    c.access_key_id = "AKIDTESTKEY";
    c.secret_access_key = "sEcReT/never+printed";
    c.endpoint = endpoint;
    c.path_style = true;
    c.retry = {4, std::chrono::milliseconds(1), std::chrono::milliseconds(4)};
    return c;
  }

  S3Location At(const std::string& key) const { return {kBucket, key}; }

  // Sends a command to the proxy and checks its "ok".
  void Proxy(const std::string& command) {
    S3_ASSERT_OK(proxy_->WriteLine(command));
    Result<std::string> answer = proxy_->ReadLine();
    S3_ASSERT_OK(answer);
    ASSERT_EQ(*answer, "ok") << command;
  }

  // Every request the proxy received so far.
  std::vector<ProxyRequest> ProxyLog() {
    std::vector<ProxyRequest> out;
    EXPECT_TRUE(IsOk(proxy_->WriteLine("log")));
    for (Result<std::string> line = proxy_->ReadLine(); line.ok() && *line != "ok";
         line = proxy_->ReadLine()) {
      out.push_back(ParseProxyLine(*line));
    }
    return out;
  }

  // How many logged requests have `method` and a target containing `part`.
  size_t CountRequests(const std::string& method, const std::string& part) {
    size_t n = 0;
    for (const ProxyRequest& r : ProxyLog()) {
      n += r.method == method && r.target.find(part) != std::string::npos;
    }
    return n;
  }

  ScratchDir bodies_{"/tmp"};
  std::unique_ptr<PythonProcess> moto_;
  std::vector<std::string> moto_fields_;  // what moto_server.py printed
  std::unique_ptr<PythonProcess> proxy_;
  S3Config config_;
  std::unique_ptr<S3Client> client_;
};

}  // namespace shardsafe::testing
