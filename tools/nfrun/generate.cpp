// nfrun generate: prefill a prompt, then sample token by token.
#include "commands.h"

#include "nf/nf.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

namespace nfrun {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

/// Parses "3,17,42" (spaces allowed).
nf::StatusOr<std::vector<int32_t>> parseTokens(const std::string &text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t b = item.find_first_not_of(" \t");
    size_t e = item.find_last_not_of(" \t");
    std::string s = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    char *end = nullptr;
    errno = 0;
    long long v = s.empty() ? -1 : std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno || v < 0 || v > INT32_MAX)
      return nf::Status::error("--prompt-tokens: '" + s +
                               "' is not a token id");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty())
    return nf::Status::error("--prompt-tokens: no token ids");
  return ids;
}

/// One tensor of a safetensors file.
struct OutTensor {
  std::string name;
  std::string dtype; // "F32", "I64"
  std::vector<int64_t> shape;
  const void *data;
  size_t bytes;
};

/// Writes a safetensors file (atomically: temporary file, then rename).
nf::Status writeSafetensors(const std::string &path,
                            const std::vector<OutTensor> &tensors) {
  std::string header = "{";
  size_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const OutTensor &t = tensors[i];
    header += (i ? "," : "") + std::string("\"") + t.name + "\":{\"dtype\":\"" +
              t.dtype + "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d)
      header += (d ? "," : "") + std::to_string(t.shape[d]);
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + t.bytes) + "]}";
    offset += t.bytes;
  }
  header += "}";
  while (header.size() % 8)
    header += ' ';
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      return nf::Status::error(path + ": cannot open for writing");
    uint64_t n = header.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i)
      len[i] = static_cast<unsigned char>(n >> (8 * i));
    out.write(reinterpret_cast<const char *>(len), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const OutTensor &t : tensors)
      out.write(static_cast<const char *>(t.data),
                static_cast<std::streamsize>(t.bytes));
    out.flush();
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      return nf::Status::error(path + ": write failed");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    return nf::Status::error(path + ": cannot replace: " + ec.message());
  return nf::Status::success();
}

} // namespace

int runGenerate(const GenerateFlags &f) {
  nf::ModelParams mp = modelParams(f.common);
  mp.maxSequences = 1;
  auto loaded = nf::Model::load(f.common.plan, mp);
  if (!loaded)
    return fail(loaded.message());
  nf::Model &model = *loaded;
  const size_t vocab = static_cast<size_t>(model.vocabSize());

  std::vector<int32_t> prompt;
  if (f.havePrompt) {
    auto ids = model.tokenize(f.prompt);
    if (!ids)
      return fail(ids.message());
    prompt = std::move(*ids);
    if (prompt.empty())
      return fail("--prompt: the prompt encodes to no tokens");
  } else {
    auto ids = parseTokens(f.promptTokens);
    if (!ids)
      return fail(ids.message());
    prompt = std::move(*ids);
    for (int32_t t : prompt)
      if (static_cast<size_t>(t) >= vocab)
        return fail(f.common.plan + ": --prompt-tokens: token " +
                    std::to_string(t) + " is outside the vocabulary [0, " +
                    std::to_string(vocab) + ")");
  }

  nf::SamplerParams sp;
  sp.temperature = f.temperature;
  sp.topK = f.topK;
  sp.topP = f.topP;
  sp.minP = f.minP;
  sp.seed = f.seed;
  auto sampler = nf::Sampler::create(sp);
  if (!sampler)
    return fail(sampler.message());

  auto seq = model.addSequence();
  if (!seq)
    return fail(seq.message());

  const bool dump = !f.dumpLogits.empty();
  std::vector<float> logits, prefillLogits, stepLogits;
  std::vector<int64_t> generated;

  // One step and its sampled token. Without a dump, nf_decode_sample: a
  // greedy, small top-k or temperature-only sampler then reads the row's
  // best where the backend ranks them on the device, not the whole row.
  std::vector<nf::Sampler *> samplers{&*sampler};
  std::vector<int32_t> sampledTokens;
  auto step = [&](const nf::SeqInput &in, bool allLogits,
                  bool sample = true) -> nf::StatusOr<int32_t> {
    if (!dump && sample) {
      if (auto st = model.decodeSample({in}, samplers, sampledTokens); !st)
        return st;
      if (sampledTokens[0] < 0)
        return nf::Status::error(nf_last_error());
      return sampledTokens[0];
    }
    if (auto st = model.decode({in}, allLogits, logits); !st)
      return st;
    if (!sample) // the dump's last row, or nothing to generate
      return -1;
    return sampler->sample(logits.data() + (logits.size() - vocab), vocab);
  };

  auto t0 = Clock::now();
  nf::SeqInput in;
  in.seq = *seq;
  in.tokens = prompt;
  in.expertBudget = f.expertBudget;
  auto token = step(in, /*allLogits=*/dump, /*sample=*/f.maxTokens > 0);
  if (!token)
    return fail(token.message());
  auto t1 = Clock::now();
  if (dump)
    prefillLogits = logits;

  std::vector<int32_t> stops = f.stopTokens;
  // The text as the serving engine streams it (libnf's text stream): each
  // token's bytes in context, cut before a stop string.
  const bool haveText = model.hasTokenizer();
  if (!haveText && !f.stopStrings.empty())
    return fail(f.common.plan + ": --stop needs the model's tokenizer");
  std::optional<nf::TextStream> text;
  if (haveText) {
    auto t = nf::TextStream::create(model, f.stopStrings);
    if (!t)
      return fail(t.message());
    text.emplace(std::move(*t));
  }
  bool endsWithNewline = true;
  auto print = [&](const std::string &piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    if (!piece.empty())
      endsWithNewline = piece.back() == '\n';
  };
  int64_t decodeSteps = 0;
  while (static_cast<int>(generated.size()) < f.maxTokens) {
    generated.push_back(*token);
    bool stopString = false;
    const bool stopToken =
        (!f.ignoreEos && model.isEos(*token)) ||
        std::find(stops.begin(), stops.end(), *token) != stops.end();
    if (haveText && !stopToken) {
      auto piece = text->add(*token, false, &stopString);
      if (!piece)
        return fail(piece.message());
      print(*piece);
    } else if (!haveText) {
      std::printf("%s%d", generated.size() > 1 ? " " : "", *token);
      std::fflush(stdout);
    }
    bool stop = stopToken || stopString;
    bool last_ = stop || static_cast<int>(generated.size()) >= f.maxTokens;
    if (last_ && !dump)
      break;
    // Feed the token: the next token (or, after the last one, its row of
    // step_logits).
    in.tokens = {*token};
    token = step(in, false, !last_);
    if (!token)
      return fail(token.message());
    ++decodeSteps;
    if (dump)
      stepLogits.insert(stepLogits.end(), logits.begin(), logits.end());
    if (last_)
      break;
  }
  auto t2 = Clock::now();
  if (haveText) { // what was held back
    auto rest = text->finish();
    if (!rest)
      return fail(rest.message());
    print(*rest);
  }
  if (!haveText || !endsWithNewline || generated.empty())
    std::printf("\n");
  std::fflush(stdout);

  const double prefillS = seconds(t0, t1), decodeS = seconds(t1, t2);
  std::fprintf(stderr,
               "prompt %zu tokens: prefill %.1f tok/s (%.1f ms); generated "
               "%zu tokens: decode %.1f tok/s (%lld steps, %.1f ms)\n",
               prompt.size(), prefillS > 0 ? prompt.size() / prefillS : 0.0,
               prefillS * 1e3, generated.size(),
               decodeS > 0 && decodeSteps ? decodeSteps / decodeS : 0.0,
               static_cast<long long>(decodeSteps), decodeS * 1e3);
  std::fprintf(stderr, "backend: %s\n", model.backend().c_str());
  // Routed-expert work of this request, from the per-process counters (this
  // process ran nothing else): calls per MoE layer and the budget spent.
  if (model.numMoeLayers() > 0) {
    auto used = model.expertUtilization();
    if (!used)
      return fail(used.message());
    const int64_t tokens = static_cast<int64_t>(prompt.size()) + decodeSteps;
    int64_t total = 0;
    std::string perLayer;
    for (const auto &layer : *used) {
      int64_t calls = 0;
      for (int64_t c : layer)
        calls += c;
      total += calls;
      perLayer += (perLayer.empty() ? "" : " ") + std::to_string(calls);
    }
    const double full = static_cast<double>(model.expertsPerToken()) *
                        model.numMoeLayers() * tokens;
    std::fprintf(stderr,
                 "expert calls: %lld (per MoE layer: %s); budget spent %.3f "
                 "of static top-%d\n",
                 static_cast<long long>(total), perLayer.c_str(),
                 full > 0 ? total / full : 0.0, model.expertsPerToken());
  }

  if (dump) {
    const int64_t T = static_cast<int64_t>(prompt.size());
    const int64_t S = static_cast<int64_t>(generated.size());
    const int64_t V = static_cast<int64_t>(vocab);
    std::vector<OutTensor> tensors = {{"prefill_logits",
                                       "F32",
                                       {T, V},
                                       prefillLogits.data(),
                                       prefillLogits.size() * sizeof(float)},
                                      {"step_logits",
                                       "F32",
                                       {S, V},
                                       stepLogits.data(),
                                       stepLogits.size() * sizeof(float)},
                                      {"tokens",
                                       "I64",
                                       {S},
                                       generated.data(),
                                       generated.size() * sizeof(int64_t)}};
    if (auto st = writeSafetensors(f.dumpLogits, tensors); !st)
      return fail(st.message());
  }
  if (auto st = model.removeSequence(*seq); !st)
    return fail(st.message());
  return 0;
}

} // namespace nfrun
