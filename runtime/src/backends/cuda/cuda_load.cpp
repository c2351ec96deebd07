// The CUDA engine's load steps (called in order by CudaEngine::init): the
// step programs read from the plan (the MoE selects and where their
// statistics are), the modules and launches checked against the device (and
// the decode step's top-logits launches), the weights uploaded, the TMA
// tensor maps that modules declare encoded, and the device buffers (arena,
// state, step arguments, statistics, top lists). The class is in
// cuda_engine_impl.h.
#include "backends/cuda/cuda_engine_impl.h"

#include "nf_abi.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>
#include <unordered_map>

namespace nf::engine::cuda_detail {

// ---------------------------------------------------------------------------
// Load

namespace {

/// A quantised weight's scales on the device: the scale of each row, or of
/// each group of each row for int4 (nf::weight_row_scales), then for static FP8
/// activations one input scale, the largest of the parts' (the CUDA GEMMs
/// quantise a linear's input rows once; ModelOpt gives q, k and v, which read
/// the same rows, equal scales, and the routed experts of a layer one; vLLM
/// takes the largest likewise).
std::vector<float> deviceScales(const BoundWeight &w) {
  std::vector<float> out = w.rowScales;
  if (w.input.kind == pl::ActivationQuant::StaticPerTensor &&
      !w.input.scales.empty())
    out.push_back(
        *std::max_element(w.input.scales.begin(), w.input.scales.end()));
  return out;
}

} // namespace

Status CudaEngine::readPrograms() {
  const pl::Plan &plan = *plan_->plan;
  const int64_t numWeights = static_cast<int64_t>(weights_->weights.size());
  for (int phase = 0; phase < 2; ++phase)
    if (Status s =
            readStepValues(*plan_, stepOf(plan, phase), phaseOf(phase),
                           numWeights, info_.vocabSize, programs_[phase]);
        !s)
      return s;

  // MoE layers: the select ops, numbered in program order as on the CPU;
  // the model's k is the smallest top_k.
  for (int phase = 0; phase < 2; ++phase) {
    Program &p = programs_[phase];
    const pl::Step &step = *stepOf(plan, phase);
    const int32_t nv = static_cast<int32_t>(p.values.size());
    int32_t moe = 0;
    size_t launchesSoFar = 0;
    const bool inArena = step.expert_stats_offset() >= 0;
    int32_t stepMaxK = 0;
    for (fb::uoffset_t k = 0; k < step.kernels()->size(); ++k) {
      const pl::Kernel &kernel = *step.kernels()->Get(k);
      launchesSoFar += kernel.launches() ? kernel.launches()->size() : 0;
      if (!kernel.ops())
        continue;
      auto isOutput = [&](int32_t v) {
        if (!kernel.outputs())
          return false;
        for (int32_t o : *kernel.outputs())
          if (o == v)
            return true;
        return false;
      };
      const auto &ops = *kernel.ops();
      // Whether `v` is intact when the kernel ends: one of its outputs, or
      // a value no later op of the kernel (after op `j`) writes over.
      auto intactAtEnd = [&](int32_t v, fb::uoffset_t j) {
        if (isOutput(v))
          return true;
        const ValueInfo &vi = p.values[v];
        for (fb::uoffset_t later = j + 1; later < ops.size(); ++later) {
          const auto *res = ops.Get(later)->results();
          if (!res)
            continue;
          for (int32_t r : *res) {
            if (r < 0 || r >= nv)
              return false;
            const ValueInfo &ri = p.values[r];
            if (ri.kind != pl::ValueKind::Tensor &&
                ri.kind != pl::ValueKind::Dispatch)
              continue;
            if (ri.offset < vi.offset + vi.bytes &&
                vi.offset < ri.offset + ri.bytes)
              return false;
          }
        }
        return true;
      };
      for (fb::uoffset_t j = 0; j < ops.size(); ++j) {
        const pl::Op *op = ops.Get(j);
        if (pl::opCode(*op) != pl::OpCode::Select)
          continue;
        const std::string ctx =
            kernelWhere(*plan_, phase, k, kernel) + " op nf_moe.select";
        std::optional<int64_t> topK = intAttr(*op, attr::TopK);
        if (!topK || *topK <= 0 || *topK > 4096)
          return Status::error(ctx + ": missing or bad attribute 'top_k'");
        const int32_t K = static_cast<int32_t>(*topK);
        const auto *in = op->operands();
        const auto *out = op->results();
        if (!in || in->size() < 1 || in->Get(0) < 0 || in->Get(0) >= nv ||
            p.values[in->Get(0)].kind != pl::ValueKind::Tensor)
          return Status::error(ctx + ": expects scores as its first operand");
        info_.numExperts = std::max<int32_t>(
            info_.numExperts, static_cast<int32_t>(p.values[in->Get(0)].cols));
        maxExpertsOverride_ =
            maxExpertsOverride_ == 0 ? K : std::min(maxExpertsOverride_, K);
        maxK_ = std::max(maxK_, K);
        const int32_t layer = moe++;
        // Statistics: experts [T, k] and counts [T], i32, in the arena when
        // the kernel ends.
        auto isI32Rows = [&](int32_t v, int64_t cols) {
          return v >= 0 && v < nv &&
                 p.values[v].kind == pl::ValueKind::Tensor &&
                 p.values[v].dtype == pl::DType::I32 &&
                 p.values[v].rows == pl::Rows::Tokens &&
                 p.values[v].cols == cols;
        };
        if (out && out->size() == 3 && isI32Rows(out->Get(0), K) &&
            isI32Rows(out->Get(2), 1) &&
            (inArena ||
             (intactAtEnd(out->Get(0), j) && intactAtEnd(out->Get(2), j))) &&
            kernel.launches() && kernel.launches()->size() > 0) {
          StatCopy c;
          // In the arena's statistics region: read after the step.
          c.afterLaunch =
              inArena ? std::numeric_limits<size_t>::max() : launchesSoFar;
          c.layer = layer;
          c.k = K;
          c.countsOffset = p.values[out->Get(2)].offset;
          c.expertsOffset = p.values[out->Get(0)].offset;
          p.copies.push_back(c);
          stepMaxK = std::max(stepMaxK, K);
        } else {
          p.statsAvailable = false;
        }
      }
    }
    info_.numMoeLayers = std::max(info_.numMoeLayers, moe);
    if (inArena && moe > 0) {
      p.statsOffset = step.expert_stats_offset();
      p.statsRows = step.max_tokens();
      p.statsMaxK = stepMaxK;
      p.statsLayers = moe;
      const int64_t end =
          p.statsOffset + 4 * p.statsLayers * p.statsRows * (1 + p.statsMaxK);
      if (!p.statsAvailable || p.statsRows <= 0 ||
          end > step.arena_bytes() + step.scratch_bytes())
        return Status::error(plan_->path + ": " + phaseOf(phase) +
                             " step: expert statistics region [" +
                             std::to_string(p.statsOffset) + ", " +
                             std::to_string(end) +
                             ") does not fit the arena or its selects");
    }
  }
  info_.topK = maxExpertsOverride_;
  info_.expertStats = prefill_.statsAvailable && decode_.statsAvailable;
  utilization_.assign(
      static_cast<size_t>(info_.numMoeLayers),
      std::vector<int64_t>(static_cast<size_t>(info_.numExperts), 0));
  return Status::success();
}

Status CudaEngine::loadKernels() {
  const pl::Plan &plan = *plan_->plan;
  const DeviceInfo &dev = probe_->device;
  Gpu &g = *gpu_;
  // Programmatic dependent launches (sm_90+, through cuLaunchKernelEx);
  // NF_CUDA_PDL=0 turns them off.
  {
    const char *e = std::getenv("NF_CUDA_PDL");
    usePdl_ = dev.major >= 9 && d_->cuLaunchKernelEx != nullptr &&
              !(e && std::string_view(e) == "0");
  }
  // Kernels with identical images share a module.
  std::unordered_map<std::string_view, size_t> moduleOf;
  for (int phase = 0; phase < 2; ++phase) {
    const pl::Step &step = *stepOf(plan, phase);
    Program &p = programs_[phase];
    const auto &images = probe_->images[phase];
    std::vector<CUmodule> kernelModule(step.kernels()->size(), nullptr);
    for (fb::uoffset_t k = 0; k < step.kernels()->size(); ++k) {
      const pl::Kernel &kernel = *step.kernels()->Get(k);
      if (!kernel.launches() || kernel.launches()->size() == 0)
        continue;
      const std::string kwhere = kernelWhere(*plan_, phase, k, kernel);
      const CudaProbe::Image &img = images[k];
      const std::string_view key(static_cast<const char *>(img.data), img.size);
      auto it = moduleOf.find(key);
      if (it == moduleOf.end()) {
        StatusOr<Module> m = loadModule(*d_, img.data, img.size, img.ptx);
        if (!m)
          return Status::error(kwhere + ": " + m.message());
        g.modules.push_back(std::move(*m));
        g.moduleWhere.push_back(kwhere);
        it = moduleOf.emplace(key, g.modules.size() - 1).first;
      }
      const CUmodule module = g.modules[it->second].get();
      kernelModule[k] = module;
      for (fb::uoffset_t j = 0; j < kernel.launches()->size(); ++j) {
        StatusOr<LaunchInfo> li =
            loadLaunch(*kernel.launches()->Get(j), module,
                       kwhere + " launch " + std::to_string(j),
                       std::string(phase == 0 ? "prefill " : "decode ") +
                           (kernel.name() ? kernel.name()->str() : "?"));
        if (!li)
          return li.status();
        p.launches.push_back(std::move(*li));
      }
    }
    // NF_CUDA_TOP_LOGITS=0: steps return rows only (to compare).
    const char *topEnv = std::getenv("NF_CUDA_TOP_LOGITS");
    const pl::TopLogits *t = step.top_logits();
    if (t && phase == 1 && !(topEnv && std::string_view(topEnv) == "0")) {
      // Checked like the kernels' own launches, and against the arena.
      const std::string twhere = plan_->path + ": decode top logits";
      const int64_t rows = step.max_tokens(), k = t->k();
      const int64_t end = step.arena_bytes() + step.scratch_bytes();
      if (t->kernel() < 0 ||
          t->kernel() >= static_cast<int32_t>(kernelModule.size()) ||
          !kernelModule[static_cast<size_t>(t->kernel())] || k <= 0 ||
          k > 4096 || !t->launches() || t->launches()->size() == 0)
        return Status::error(twhere + ": kernel " +
                             std::to_string(t->kernel()) + ", k " +
                             std::to_string(k) + " or launches invalid");
      for (int64_t off : {t->ids_offset(), t->values_offset()})
        if (off < 0 || off % 4 != 0 || off + rows * k * 4 > end)
          return Status::error(twhere + ": list at " + std::to_string(off) +
                               " does not fit the arena (" +
                               std::to_string(end) + " bytes)");
      if (const int64_t off = t->noise_offset();
          off != -1 &&
          (off < 0 || off % 8 != 0 || off + rows * kTopNoiseBytes > end))
        return Status::error(twhere + ": noise rows at " + std::to_string(off) +
                             " do not fit the arena (" + std::to_string(end) +
                             " bytes)");
      p.top.k = static_cast<int32_t>(k);
      p.top.idsOffset = t->ids_offset();
      p.top.valuesOffset = t->values_offset();
      // The records' flags (keys, total) are 1.7's: a 1.6 plan's
      // functions ranked by keys wherever the temperature was set, which
      // this runtime's records would misread; its lists rank by logit.
      const bool records = plan.version_minor() >= 7;
      p.top.noiseOffset = records ? t->noise_offset() : -1;
      if (const int64_t off = records ? t->totals_offset() : -1;
          off != -1 && (off < 0 || off % 8 != 0 || off + rows * 8 > end ||
                        p.top.noiseOffset < 0))
        return Status::error(twhere + ": totals at " + std::to_string(off) +
                             " do not fit the arena (" + std::to_string(end) +
                             " bytes) or come without noise rows");
      p.top.totalsOffset = records ? t->totals_offset() : -1;
      for (fb::uoffset_t j = 0; j < t->launches()->size(); ++j) {
        StatusOr<LaunchInfo> li = loadLaunch(
            *t->launches()->Get(j),
            kernelModule[static_cast<size_t>(t->kernel())],
            twhere + " launch " + std::to_string(j), "decode top logits");
        if (!li)
          return li.status();
        li->programmatic = false; // after a graph, not inside one
        p.top.launches.push_back(std::move(*li));
      }
    }
  }
  return Status::success();
}

/// One launch of a module, checked against the device.
StatusOr<LaunchInfo> CudaEngine::loadLaunch(const pl::Launch &l,
                                            CUmodule module, std::string where,
                                            const std::string &profileKind) {
  const DeviceInfo &dev = probe_->device;
  LaunchInfo li;
  li.where = std::move(where);
  if (!l.function() || l.function()->size() == 0)
    return Status::error(li.where + ": no function name");
  li.where += " (" + l.function()->str() + ")";
  {
    std::string fn = l.function()->str();
    // k12_op3_linear -> linear: one profile row per kind of launch.
    size_t cut = 0;
    for (int part = 0; part < 2; ++part) {
      size_t u = fn.find('_', cut);
      if (u == std::string::npos)
        break;
      cut = u + 1;
    }
    li.profileKey = profileKind + ": " + fn.substr(cut);
  }
  li.grid = l.grid();
  li.block = l.block();
  li.shared = l.shared_bytes();
  li.cooperative = l.cooperative();
  li.programmatic = l.programmatic() && usePdl_ && !li.cooperative;
  li.minTokens = l.min_tokens();
  li.maxTokens = l.max_tokens();
  if (li.grid == 0 || li.grid > 0x7fffffffu || li.block == 0 ||
      static_cast<int64_t>(li.block) > dev.maxThreadsPerBlock)
    return Status::error(
        li.where + ": launch shape " + std::to_string(li.grid) + " x " +
        std::to_string(li.block) + " is not valid on this device (at most " +
        std::to_string(dev.maxThreadsPerBlock) + " threads per block)");
  if (static_cast<int64_t>(li.shared) > dev.maxSharedPerBlockOptin)
    return Status::error(li.where + ": " + std::to_string(li.shared) +
                         " bytes of shared memory; the device allows " +
                         std::to_string(dev.maxSharedPerBlockOptin));
  if (Status s = d_->check(
          d_->cuModuleGetFunction(&li.fn, module, l.function()->c_str()),
          "cuModuleGetFunction");
      !s)
    return Status::error(li.where + ": " + s.message());
  // Every launch with dynamic shared memory raises the function's
  // limit to it: the default 48 KiB covers static plus dynamic bytes,
  // so 48 KiB of dynamic memory beside any static bytes needs it too.
  if (li.shared > 0)
    if (Status s = d_->check(
            d_->cuFuncSetAttribute(
                li.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                static_cast<int>(li.shared)),
            "cuFuncSetAttribute");
        !s)
      return Status::error(li.where + ": " + s.message());
  if (li.cooperative) {
    if (!dev.cooperativeLaunch)
      return Status::error(li.where + ": needs cooperative launches, "
                                      "which the device does not "
                                      "support");
    int perSm = 0;
    if (Status s =
            d_->check(d_->cuOccupancyMaxActiveBlocksPerMultiprocessor(
                          &perSm, li.fn, static_cast<int>(li.block), li.shared),
                      "cuOccupancyMaxActiveBlocksPerMultiprocessor");
        !s)
      return Status::error(li.where + ": " + s.message());
    const int64_t resident = static_cast<int64_t>(perSm) * dev.multiprocessors;
    if (static_cast<int64_t>(li.grid) > resident)
      return Status::error(li.where + ": cooperative grid of " +
                           std::to_string(li.grid) + " blocks exceeds the " +
                           std::to_string(resident) +
                           " that can be resident at once on this device");
  }
  return li;
}

/// Every weight to the device, in stream order (all uploads go through
/// `stream`: copies on the legacy stream would not be ordered with it).
Status CudaEngine::uploadWeights() {
  Gpu &g = *gpu_;
  CUstream stream = g.stream.get();
  const auto &ws = weights_->weights;
  std::vector<size_t> offsets(ws.size());
  std::vector<size_t> sizes(ws.size());
  // Quantised weights' scales as the kernels read them (alive until the
  // copies are done).
  std::vector<std::vector<float>> scales(ws.size());
  size_t total = 0;
  const pl::Plan &plan = *plan_->plan;
  for (size_t i = 0; i < ws.size(); ++i) {
    size_t n = 1;
    for (int64_t d : ws[i].shape)
      n *= static_cast<size_t>(d);
    sizes[i] =
        n * dtypeSize(toDType(
                plan.weights()->Get(static_cast<fb::uoffset_t>(i))->dtype()));
    // Quantised: the codes as stored (FP8 a byte each, int4 eight to a
    // 4-byte word), then at the next 256 bytes the f32 scale of each row or
    // group (nf::weight_row_scales), then a static input scale.
    if (ws[i].quantised) {
      size_t codeBytes = 0;
      for (const WeightView &v : ws[i].codeParts)
        codeBytes += static_cast<size_t>(v.numElements()) * v.elementSize();
      scales[i] = deviceScales(ws[i]);
      sizes[i] = align256(codeBytes) + scales[i].size() * sizeof(float);
    }
    offsets[i] = total;
    total += align256(sizes[i]);
  }
  StatusOr<DeviceBuffer> buf = allocDevice(*d_, total);
  if (!buf)
    return Status::error(where() + ": weights: " + buf.message());
  g.weights = std::move(*buf);
  std::vector<CUdeviceptr> ptrs(ws.size());
  for (size_t i = 0; i < ws.size(); ++i) {
    const BoundWeight &w = ws[i];
    const CUdeviceptr dst = g.weights.ptr() + offsets[i];
    ptrs[i] = dst;
    const std::string ctx = where() + ": uploading weight " + std::to_string(i);
    if (w.quantised) {
      if (w.codeParts.empty())
        return Status::error(ctx + ": quantised weight without codes");
      size_t at = 0;
      for (const WeightView &v : w.codeParts) {
        const size_t bytes =
            static_cast<size_t>(v.numElements()) * v.elementSize();
        if (Status s = d_->check(
                d_->cuMemcpyHtoDAsync(dst + at, v.data, bytes, stream),
                "cuMemcpyHtoDAsync");
            !s)
          return Status::error(ctx + ": " + s.message());
        at += bytes;
      }
      const size_t scaleBytes = scales[i].size() * sizeof(float);
      if (align256(at) + scaleBytes != sizes[i])
        return Status::error(ctx + ": codes and scales have the wrong size");
      if (Status s = d_->check(d_->cuMemcpyHtoDAsync(dst + align256(at),
                                                     scales[i].data(),
                                                     scaleBytes, stream),
                               "cuMemcpyHtoDAsync");
          !s)
        return Status::error(ctx + ": " + s.message());
      continue;
    }
    if (w.view.valid()) {
      if (Status s = d_->check(
              d_->cuMemcpyHtoDAsync(dst, w.view.data, sizes[i], stream),
              "cuMemcpyHtoDAsync");
          !s)
        return Status::error(ctx + ": " + s.message());
      continue;
    }
    // Stacked from one tensor per expert: contiguous [E, ...].
    if (w.experts.empty() || sizes[i] % w.experts.size() != 0)
      return Status::error(ctx + ": no data");
    const size_t each = sizes[i] / w.experts.size();
    for (size_t e = 0; e < w.experts.size(); ++e) {
      const WeightView &v = w.experts[e];
      if (static_cast<size_t>(v.numElements()) * v.elementSize() != each)
        return Status::error(ctx + ": expert " + std::to_string(e) +
                             " has the wrong size");
      if (Status s = d_->check(
              d_->cuMemcpyHtoDAsync(dst + e * each, v.data, each, stream),
              "cuMemcpyHtoDAsync");
          !s)
        return Status::error(ctx + ": " + s.message());
    }
  }
  if (Status s = uploadTable(ptrs, g.weightPtrs, "weight table"); !s)
    return s;
  g.weightAddr = ptrs;
  g.weightBytes = sizes;
  // The sources (the table, the mapped checkpoint) must outlive the copies.
  return syncStream(where() + ": uploading the weights");
}

Status CudaEngine::uploadTable(const std::vector<CUdeviceptr> &ptrs,
                               DeviceBuffer &out, const char *what) {
  StatusOr<DeviceBuffer> table =
      allocDevice(*d_, std::max<size_t>(ptrs.size(), 1) * sizeof(CUdeviceptr));
  if (!table)
    return Status::error(where() + ": " + what + ": " + table.message());
  out = std::move(*table);
  if (!ptrs.empty())
    if (Status s =
            d_->check(d_->cuMemcpyHtoDAsync(out.ptr(), ptrs.data(),
                                            ptrs.size() * sizeof(CUdeviceptr),
                                            gpu_->stream.get()),
                      "cuMemcpyHtoDAsync");
        !s)
      return Status::error(where() + ": " + what + ": " + s.message());
  return Status::success();
}

/// Encodes the TMA tensor maps that modules declare (nf_abi.h:
/// nf_tensor_map_descs, nf_tensor_maps) now that the weights and the arena
/// have their addresses; every map is checked to lie inside its source.
Status CudaEngine::bindTensorMaps() {
  Gpu &g = *gpu_;
  CUstream stream = g.stream.get();
  for (size_t m = 0; m < g.modules.size(); ++m) {
    const std::string &mw = g.moduleWhere[m];
    CUdeviceptr descAddr = 0, mapAddr = 0;
    size_t descBytes = 0, mapBytes = 0;
    const CUresult found = d_->cuModuleGetGlobal(
        &descAddr, &descBytes, g.modules[m].get(), "nf_tensor_map_descs");
    if (found == CUDA_ERROR_NOT_FOUND)
      continue;
    if (Status s = d_->check(found, "cuModuleGetGlobal"); !s)
      return Status::error(mw + ": " + s.message());
    if (Status s = d_->check(d_->cuModuleGetGlobal(&mapAddr, &mapBytes,
                                                   g.modules[m].get(),
                                                   "nf_tensor_maps"),
                             "cuModuleGetGlobal");
        !s)
      return Status::error(mw + ": nf_tensor_maps: " + s.message());
    const size_t n = descBytes / sizeof(nf_tensor_map_desc);
    if (n == 0 || descBytes % sizeof(nf_tensor_map_desc) != 0 ||
        mapBytes != n * sizeof(CUtensorMap) || mapAddr % 64 != 0)
      return Status::error(mw + ": malformed tensor map declarations (" +
                           std::to_string(descBytes) + " and " +
                           std::to_string(mapBytes) + " bytes)");
    if (!d_->cuTensorMapEncodeTiled)
      return Status::error(mw + ": needs TMA tensor maps, but the driver has "
                                "no cuTensorMapEncodeTiled (CUDA 12 or later)");
    std::vector<nf_tensor_map_desc> descs(n);
    if (Status s = d_->check(
            d_->cuMemcpyDtoHAsync(descs.data(), descAddr, descBytes, stream),
            "cuMemcpyDtoHAsync");
        !s)
      return Status::error(mw + ": " + s.message());
    if (Status s = syncStream(mw); !s)
      return s;
    std::vector<CUtensorMap> maps(n);
    for (size_t i = 0; i < n; ++i) {
      const nf_tensor_map_desc &t = descs[i];
      const std::string what = mw + ": tensor map " + std::to_string(i);
      CUdeviceptr base = 0;
      size_t size = 0;
      if (t.source == NF_TENSOR_MAP_WEIGHT && t.index >= 0 &&
          static_cast<size_t>(t.index) < g.weightAddr.size()) {
        base = g.weightAddr[static_cast<size_t>(t.index)];
        size = g.weightBytes[static_cast<size_t>(t.index)];
      } else if (t.source == NF_TENSOR_MAP_ARENA) {
        base = g.arena.ptr();
        size = g.arenaBytes;
      } else {
        return Status::error(what + ": unknown source " +
                             std::to_string(t.source) + " / " +
                             std::to_string(t.index));
      }
      // Inside its source, strides and addresses as TMA needs them.
      const bool valid =
          t.offset >= 0 && t.dims[0] > 0 && t.dims[1] > 0 &&
          t.stride >= 2 * t.dims[0] && t.stride % 16 == 0 &&
          (base + static_cast<CUdeviceptr>(t.offset)) % 16 == 0 &&
          t.box[0] * 2 == 128 && t.box[1] > 0 && t.box[1] <= 256 &&
          static_cast<size_t>(t.offset + (t.dims[1] - 1) * t.stride +
                              2 * t.dims[0]) <= size;
      if (!valid)
        return Status::error(what + " does not fit its source (" +
                             std::to_string(size) + " bytes)");
      const unsigned long long dims[2] = {
          static_cast<unsigned long long>(t.dims[0]),
          static_cast<unsigned long long>(t.dims[1])};
      const unsigned long long strides[1] = {
          static_cast<unsigned long long>(t.stride)};
      const unsigned box[2] = {static_cast<unsigned>(t.box[0]),
                               static_cast<unsigned>(t.box[1])};
      const unsigned elementStrides[2] = {1, 1};
      if (Status s = d_->check(
              d_->cuTensorMapEncodeTiled(
                  &maps[i], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                  reinterpret_cast<void *>(
                      static_cast<uintptr_t>(base + t.offset)),
                  dims, strides, box, elementStrides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
              "cuTensorMapEncodeTiled");
          !s)
        return Status::error(what + ": " + s.message());
    }
    if (Status s = d_->check(
            d_->cuMemcpyHtoDAsync(mapAddr, maps.data(), mapBytes, stream),
            "cuMemcpyHtoDAsync");
        !s)
      return Status::error(mw + ": " + s.message());
    // `maps` must outlive the copy.
    if (Status s = syncStream(mw); !s)
      return s;
  }
  return Status::success();
}

/// Device memory a KV cache sized by the utilisation leaves besides the
/// recurrent state and the page tables: the step arguments' other arrays,
/// statistics, captured graphs.
constexpr int64_t kKvSizingReserve = int64_t{256} << 20;

/// Sizes the KV cache to the memory the engine may take
/// (EngineOptions::gpuMemoryUtilization of the device's): once the weights
/// and the arena are allocated, as many pages as fit beside the recurrent
/// state of every slot, the page tables' rows (at their longest) and
/// kKvSizingReserve; then the sequences' bookkeeping for that many pages.
Status CudaEngine::sizeKvCache() {
  size_t freeBytes = 0, totalBytes = 0;
  if (Status s =
          d_->check(d_->cuMemGetInfo(&freeBytes, &totalBytes), "cuMemGetInfo");
      !s)
    return Status::error(where() + ": sizing the KV cache: " + s.message());
  const int64_t slots = storage_.cache.numSlots, ps = storage_.cache.pageSize;
  int64_t state = 0, perPage = 0;
  for (const StorageInfo &si : storage_.entries)
    if (si.kind == pl::StorageKind::KVCache)
      perPage += 2 * cpu::kvPageBytes(si.kv, ps); // K and V
    else
      state += slots * (si.mamba.convStateSize() + si.mamba.ssmStateSize()) *
               static_cast<int64_t>(sizeof(float));
  // The step arguments' page-table rows, at their longest.
  const int64_t rows =
      std::min<int64_t>(std::max(prefill_.maxTokens, decode_.maxTokens), slots);
  const int64_t pageTables =
      rows * kMaxSequencePages * static_cast<int64_t>(sizeof(int32_t));
  const double gib = 1.0 / (1u << 30);
  const int64_t total = static_cast<int64_t>(totalBytes);
  const int64_t used = total - static_cast<int64_t>(freeBytes);
  const int64_t allowed =
      static_cast<int64_t>(gpuMemoryUtilization_ * static_cast<double>(total));
  const int64_t budget = allowed - used - state - pageTables - kKvSizingReserve;
  const int64_t pages =
      std::min<int64_t>(budget / std::max<int64_t>(perPage, 1),
                        std::numeric_limits<int32_t>::max());
  if (pages < 1) {
    char why[320];
    std::snprintf(why, sizeof why,
                  ": gpu memory utilization %.2f of %.1f GiB leaves no room "
                  "for the KV cache: %.1f GiB in use (the weights, the "
                  "arena, other processes), %.2f GiB for the recurrent state "
                  "of %lld sequences",
                  gpuMemoryUtilization_, static_cast<double>(total) * gib,
                  static_cast<double>(used) * gib,
                  static_cast<double>(state) * gib,
                  static_cast<long long>(slots));
    return Status::error(where() + why);
  }
  storage_.cache.numPages = static_cast<int32_t>(pages);
  storage_.maxContext = pages * ps;
  return createBookkeeping();
}

Status CudaEngine::allocate() {
  Gpu &g = *gpu_;
  CUstream stream = g.stream.get();
  auto alloc = [&](DeviceBuffer &out, size_t bytes, const char *what,
                   bool zero) -> Status {
    StatusOr<DeviceBuffer> b = allocDevice(*d_, bytes);
    if (!b)
      return Status::error(where() + ": " + what + ": " + b.message());
    out = std::move(*b);
    if (zero)
      if (Status s =
              d_->check(d_->cuMemsetD8Async(out.ptr(), 0,
                                            std::max<size_t>(bytes, 1), stream),
                        "cuMemsetD8Async");
          !s)
        return Status::error(where() + ": " + what + ": " + s.message());
    return Status::success();
  };

  // The arena.
  const int64_t arena = std::max(prefill_.arenaBytes + prefill_.scratchBytes,
                                 decode_.arenaBytes + decode_.scratchBytes);
  if (Status s =
          alloc(g.arena, static_cast<size_t>(std::max<int64_t>(arena, 1)),
                "arena", true);
      !s)
    return s;
  g.arenaBytes = static_cast<size_t>(std::max<int64_t>(arena, 0));
  if (gpuMemoryUtilization_ > 0.0 && storage_.hasAttention)
    if (Status s = sizeKvCache(); !s)
      return s;

  // State: two buffers per storage entry.
  const int64_t slots = storage_.cache.numSlots;
  std::vector<CUdeviceptr> sptrs;
  for (const StorageInfo &si : storage_.entries) {
    size_t a = 0, b = 0;
    if (si.kind == pl::StorageKind::KVCache) {
      a = b =
          static_cast<size_t>(storage_.cache.numPages) *
          static_cast<size_t>(cpu::kvPageBytes(si.kv, storage_.cache.pageSize));
    } else {
      a = static_cast<size_t>(slots * si.mamba.convStateSize()) * sizeof(float);
      b = static_cast<size_t>(slots * si.mamba.ssmStateSize()) * sizeof(float);
    }
    for (size_t bytes : {a, b}) {
      DeviceBuffer buf;
      if (Status s = alloc(buf, bytes, "state", true); !s)
        return s;
      sptrs.push_back(buf.ptr());
      g.storage.push_back(std::move(buf));
    }
  }
  if (Status s = uploadTable(sptrs, g.storagePtrs, "state table"); !s)
    return s;
  // `sptrs` must outlive its copy.
  if (Status s = syncStream(where() + ": state table"); !s)
    return s;

  // Step arguments: the struct, then the per-run arrays. A run has at most
  // max_tokens rows and at most one sequence per row or per slot; a page
  // table row holds at most every page.
  ArgsLayout &L = layout_;
  L.maxRows = std::max(prefill_.maxTokens, decode_.maxTokens);
  L.maxSeqs = std::min<int64_t>(L.maxRows, slots);
  L.maxPages =
      storage_.hasAttention
          ? std::min<int64_t>(storage_.cache.numPages, kMaxSequencePages)
          : 1;
  size_t at = align256(sizeof(nf_step_args));
  auto take = [&](size_t &off, size_t bytes) {
    off = at;
    at += align256(bytes);
  };
  const size_t R = static_cast<size_t>(L.maxRows);
  const size_t S = static_cast<size_t>(L.maxSeqs);
  take(L.tokens, R * sizeof(int32_t));
  take(L.budget, R * sizeof(float));
  take(L.seqs, S * sizeof(nf_seq_desc));
  take(L.tokenSeq, R * sizeof(int32_t));
  take(L.logitRows, R * sizeof(int32_t));
  take(L.moves, storage_.cache.hotWindow > 0
                    ? 2 * cpu::Caches::kMaxKvMoves * sizeof(int32_t)
                    : 0);
  take(L.pages, S * static_cast<size_t>(L.maxPages) * sizeof(int32_t));
  L.end = at;
  if (Status s = alloc(g.args, L.end, "step arguments", true); !s)
    return s;
  StatusOr<PinnedBuffer> staging = allocPinned(*d_, L.end);
  if (!staging)
    return Status::error(where() + ": step arguments: " + staging.message());
  g.staging = std::move(*staging);
  std::memset(g.staging.data(), 0, L.end);

  // Expert statistics: per MoE layer, counts [R] then experts [R, max k].
  if (info_.numMoeLayers > 0 && info_.expertStats) {
    const size_t bytes = static_cast<size_t>(info_.numMoeLayers) * R *
                         (1 + static_cast<size_t>(maxK_)) * sizeof(int32_t);
    if (Status s = alloc(g.stats, bytes, "expert statistics", true); !s)
      return s;
    StatusOr<PinnedBuffer> host = allocPinned(*d_, bytes);
    if (!host)
      return Status::error(where() + ": expert statistics: " + host.message());
    g.statsHost = std::move(*host);
  }
  // Top-logits lists of a decode step: ids then values, [rows][k] each,
  // then the rows' noise to upload, then their totals.
  if (decode_.top.k > 0) {
    StatusOr<PinnedBuffer> host = allocPinned(
        *d_, static_cast<size_t>(decode_.maxTokens) *
                 (static_cast<size_t>(decode_.top.k) * 8 + kTopNoiseBytes + 8));
    if (!host)
      return Status::error(where() + ": top logits: " + host.message());
    g.topHost = std::move(*host);
  }
  return Status::success();
}

} // namespace nf::engine::cuda_detail
