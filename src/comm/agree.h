// Helpers that make every rank reach the same outcome.
//
// A collective protocol must never leave a rank waiting: a rank that failed
// locally still enters the next collective and sends its failure through it.
// These helpers do that exchange and turn "some rank failed" into the same
// error on every rank, naming the rank.
#pragma once

#include <string>
#include <vector>

#include "shardsafe/comm.h"
#include "shardsafe/status.h"

namespace shardsafe {

// All-gathers `local` and returns the failure of the lowest failing rank
// (prefixed "rank N: " when the job has several ranks), or OK on every rank.
Status AgreeOnStatus(Comm& comm, const Status& local);

// All-gathers (`local` status, `payload`). On success every rank receives all
// payloads; if any rank failed, every rank gets that rank's error.
Result<std::vector<std::string>> GatherOrFail(Comm& comm, const Status& local,
                                              std::string payload);

// Rank `root` computes `value` (or fails); every rank receives it or the
// root's error.
Result<std::string> BroadcastOrFail(Comm& comm, int root, const Result<std::string>& value);

}  // namespace shardsafe
