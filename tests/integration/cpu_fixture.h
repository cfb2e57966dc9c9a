// A fixture checkpoint on a one-thread CPU backend. The tiny fixture models gain nothing from more
// threads, and on a busy 2-core machine every parallel region would wait for a descheduled thread;
// threads split a kernel's outputs, never one output's sum, so they cannot change any result.
#pragma once
#include <memory>
#include <string>

#include "../unit/test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "io/checkpoint.h"
#include "runtime/forward.h"

namespace petrel::test {

struct CpuFixture {
  std::unique_ptr<Checkpoint> ck;
  CpuBackend backend{CpuOptions{1}};
  std::unique_ptr<Model> model;

  explicit CpuFixture(const std::string& name, int max_chunk = ForwardOptions{}.max_chunk,
                      int logit_rows = ForwardOptions{}.logit_rows)
      : ck(Checkpoint::open(fixture_model(name))) {
    ForwardOptions fo;
    fo.max_chunk = max_chunk;
    fo.logit_rows = logit_rows;
    model = std::make_unique<Model>(ck->config(), ck->weights(), backend, fo);
  }
  int vocab() const { return ck->config().vocab; }
};

}  // namespace petrel::test
