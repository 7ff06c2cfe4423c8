// Helpers that make every rank reach the same outcome.
//
// A collective protocol must never leave a rank waiting: a rank that failed
// locally still enters the next collective and sends its failure through it.
// These helpers do that exchange and turn "some rank failed" into the same
// error on every rank, naming the rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardsafe/comm.h"
#include "shardsafe/status.h"

namespace shardsafe {

// Returns the failure of the lowest failing rank (prefixed "rank N: " when
// the job has several ranks), or OK, on every rank. One AllReduceMax of one
// value; a second collective, a Broadcast of the error, only on failure.
Status AgreeOnStatus(Comm& comm, const Status& local);

// AgreeOnStatus and the elementwise maximum of `values` over all ranks in
// the same AllReduceMax: every rank passes as many values, and receives
// their maximum, or the lowest failing rank's error.
Result<std::vector<uint64_t>> ReduceMaxOrFail(Comm& comm, const Status& local,
                                              std::vector<uint64_t> values);

// Gathers (`local` status, `payload`) on `root` only. The root receives all
// payloads, or the lowest failing rank's error (named as above); another
// rank receives an empty vector, or its own failure. The other ranks learn
// the outcome from what the root sends next (BroadcastOrFail).
Result<std::vector<std::string>> GatherToRootOrFail(Comm& comm, int root, const Status& local,
                                                    std::string payload);

// Gathers (`local` status, `payload`) on every rank: every rank receives
// all payloads, by rank, or the lowest failing rank's error (named as
// above). One AllGather.
Result<std::vector<std::string>> AllGatherOrFail(Comm& comm, const Status& local,
                                                 std::string payload);
// Rank `root` computes one part per rank (or fails); every rank receives its
// part, or the root's error as it is.
Result<std::string> ScatterOrFail(Comm& comm, int root, Result<std::vector<std::string>> parts);

// Rank `root` computes `value` (or fails); every rank receives it or the
// root's error, prefixed "rank ROOT: " unless `name_root` is false (the
// root's error already says where it comes from).
Result<std::string> BroadcastOrFail(Comm& comm, int root, const Result<std::string>& value,
                                    bool name_root = true);

// `s` prefixed "rank N: " when the job has several ranks.
Status WithRank(const Comm& comm, int rank, const Status& s);

}  // namespace shardsafe
