/* nf.h: the public C API of libnf.
 *
 * Loads an execution plan written by `nfc compile` (plan.nfb) with its
 * safetensors weights, runs sequences through it step by step (continuous
 * batching), samples tokens and tokenizes text. C99; every entry point is
 * noexcept in effect: failures are reported as nf_status codes, never as C++
 * exceptions, and the message of the last failure on the calling thread is
 * available from nf_last_error().
 *
 * Conventions
 *  - Handles are opaque (nf_model, nf_sampler); *_free(NULL) is a no-op.
 *  - Functions that write into caller buffers take a capacity; when it is too
 *    small they return NF_ERR_BUFFER_TOO_SMALL, store the size they need in
 *    *n_out (where they have one) and change nothing else.
 *  - Parameter structs are filled from their nf_*_default_params() function
 *    and then changed field by field; a NULL parameter pointer means the
 *    defaults.
 *  - Threads: an nf_model may be shared by threads for read-only calls
 *    (getters, nf_tokenize, nf_detokenize, nf_chat_apply_template); calls
 *    that change it (nf_seq_*, nf_decode, nf_generate) must not run
 *    concurrently on one model. An nf_sampler belongs to one thread at a
 *    time.
 *
 * Minimal use (greedy generation, error checks omitted):
 *
 *   nf_model *m;
 *   nf_model_load("model.nfb", NULL, &m);
 *   int32_t prompt[256], out[64];
 *   size_t n_prompt, n_out;
 *   nf_tokenize(m, "def ", 4, 0, prompt, 256, &n_prompt);
 *   nf_generate_params gp = nf_generate_default_params();
 *   gp.max_tokens = 64;
 *   nf_generate(m, prompt, n_prompt, &gp, NULL, NULL, out, 64, &n_out);
 *   nf_model_free(m);
 */
#ifndef NF_NF_H
#define NF_NF_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#if defined(NF_BUILDING_LIBRARY)
#define NF_API __declspec(dllexport)
#else
#define NF_API __declspec(dllimport)
#endif
#elif defined(__GNUC__)
#define NF_API __attribute__((visibility("default")))
#else
#define NF_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Status codes and errors                                                  */

typedef enum nf_status {
  NF_OK = 0,
  /* A NULL handle or pointer, a value out of range, an unknown or repeated
     sequence id, a token id outside the vocabulary. */
  NF_ERR_INVALID_ARGUMENT = 1,
  /* The plan, its weights or the tokenizer could not be loaded (missing or
     malformed file, version mismatch, weight shape mismatch, ...). */
  NF_ERR_LOAD = 2,
  /* The model lacks the feature (e.g. no tokenizer.json next to the weights).
   */
  NF_ERR_UNSUPPORTED = 3,
  /* A caller buffer is too small; *n_out holds the size needed. */
  NF_ERR_BUFFER_TOO_SMALL = 4,
  /* No free sequence slot, KV page or context left. */
  NF_ERR_CAPACITY = 5,
  /* A step failed while running. */
  NF_ERR_RUNTIME = 6,
  NF_ERR_OUT_OF_MEMORY = 7,
  /* A bug in nf: please report the message. */
  NF_ERR_INTERNAL = 8,
  /* The serving engine is shutting down and takes no new requests. */
  NF_ERR_UNAVAILABLE = 9
} nf_status;

/* A constant name for a status code, e.g. "NF_ERR_LOAD". */
NF_API const char *nf_status_string(nf_status status);

/* The message of the last call that failed on this thread: one line naming
   the file or object at fault and the problem. "" when no call has failed.
   Not cleared by successful calls. Valid until the next failing call on this
   thread. */
NF_API const char *nf_last_error(void);

/* The library version, e.g. "0.1.0". */
NF_API const char *nf_version(void);

/* ------------------------------------------------------------------------ */
/* Models                                                                   */

typedef struct nf_model nf_model;

typedef struct nf_model_params {
  /* Directory holding the safetensors files; NULL or "": the checkpoint
     directory recorded in the plan. */
  const char *weights_dir;
  /* tokenizer.json to use; NULL or "": <weights dir>/tokenizer.json when it
     exists (a model without one can still run on token ids). */
  const char *tokenizer_path;
  /* CPU threads for one step, at most 1024; 0: the OpenMP default. */
  int32_t n_threads;
  /* Sequences that may be alive at once; 0: the plan's state slots. */
  int32_t max_sequences;
  /* KV-cache pages per attention layer; 0: the plan's default. */
  int32_t kv_pages;
  /* Fields below were added later; new ones are appended (ABI). */
  /* The backend: "auto" (also NULL or ""), "cpu" or "cuda". "auto" runs
     plans compiled with `nfc compile --target=cuda` on the GPU when the CUDA
     driver (libcuda.so.1, loaded at run time), a device and binaries in the
     plan for it are present, else (or when the device cannot take the plan)
     on the CPU, saying why in one line on stderr ("nf: CUDA unavailable
     (...): using the CPU backend"). "cuda" fails to load (NF_ERR_LOAD)
     instead of falling back. */
  const char *backend;
  /* Nonzero: seeded random weights of the plan's shapes instead of the
     checkpoint (benchmarks of model shapes whose weights are not at hand). */
  int32_t synthetic_weights;
  uint64_t synthetic_seed;
  /* A Jinja chat template file to use (for checkpoints without one, or to
     replace theirs); NULL or "": the tokenizer's, as transformers finds it:
     chat_template.jinja in the tokenizer's directory (the weights directory,
     or that of tokenizer_path), else the "chat_template" of
     tokenizer_config.json there. A template given here that cannot be read
     or does not parse fails the load (NF_ERR_LOAD, naming the file and
     line), as does a malformed tokenizer_config.json next to the tokenizer
     (the template's special tokens come from it). The tokenizer's own
     template never fails the load: when it cannot be used (unreadable, not
     parsing, a malformed tokenizer_config.json), or there is none, the model
     loads without a chat template (nf_model_chat_template_error says why;
     nf_chat_apply_template then fails with NF_ERR_UNSUPPORTED and that
     reason). */
  const char *chat_template_path;
  /* Budget plans: "request" (also NULL or ""): each sequence spends its own
     budget on its own tokens, so its results do not depend on its
     batch-mates; "step": the calls a step's sequences are due form one
     pool, handed out by routed-weight coverage across all their tokens
     alike, and each sequence's account follows what it ran (so over its
     steps it spends its own budget). CUDA: plans of format 1.9 or later
     compiled with the budget policy. */
  const char *budget_scope;
  /* A cap on the distinct routed experts one MoE layer runs in one step
     (what a memory-bound decode step loads): >= 1 a number of experts, in
     (0, 1) a fraction of those the step's tokens' top-k candidates name; 0:
     none. The step keeps the experts that cover the most routed weight over
     its tokens; each token runs its candidates among them (at least its
     best one), renormalised. CUDA: as budget_scope. */
  double distinct_expert_cap;
  /* CUDA: the fraction of the device's memory, in (0, 1], the model may
     take: the KV-cache pages are as many as fit in it once the weights,
     the arena and the sequences' recurrent state are in place (vLLM's
     gpu_memory_utilization); kv_pages then must be 0. 0: kv_pages, or the
     plan's page count. The CPU backend ignores it. */
  double gpu_memory_utilization;
} nf_model_params;

NF_API nf_model_params nf_model_default_params(void);

/* Loads a plan and maps and checks its weights. `params` may be NULL. On
   failure *out is set to NULL. */
NF_API nf_status nf_model_load(const char *plan_path,
                               const nf_model_params *params, nf_model **out);
NF_API void nf_model_free(nf_model *model);

/* Getters; on a NULL model they return 0 / -1 / "". */
NF_API int32_t nf_model_vocab_size(const nf_model *model);
/* The BOS token id, or -1 when the model has none. */
NF_API int32_t nf_model_bos(const nf_model *model);
/* The first EOS token id, or -1 when the model has none. */
NF_API int32_t nf_model_eos(const nf_model *model);
/* Nonzero when `token` is one of the model's EOS tokens. */
NF_API int nf_model_is_eos(const nf_model *model, int32_t token);
/* The model's name as recorded in the plan. */
NF_API const char *nf_model_name(const nf_model *model);
/* One letter per layer: M (Mamba2), * (attention), - (MLP), E (MoE). */
NF_API const char *nf_model_layer_pattern(const nf_model *model);
/* Routed experts per token of the model's own top-k; 0 without MoE. */
NF_API int32_t nf_model_experts_per_token(const nf_model *model);
/* MoE layers, and routed experts per MoE layer; 0 without MoE. */
NF_API int32_t nf_model_n_moe_layers(const nf_model *model);
NF_API int32_t nf_model_n_experts(const nf_model *model);
/* Per-process expert utilisation since load (or the last reset): tokens
   routed to each expert, written row-major [moe layer][expert] into counts
   (capacity `cap` entries: n_moe_layers * n_experts are needed). */
NF_API nf_status nf_model_expert_utilization(const nf_model *model,
                                             int64_t *counts, size_t cap);
NF_API nf_status nf_model_reset_expert_utilization(nf_model *model);
/* The sampling defaults of the model's generation_config.json (next to its
   tokenizer), for requests that do not set them, as transformers and vLLM
   apply them: `set` has a bit per field found (NF_GEN_*); the fields not
   found keep nf_sampler_default_params' values. */
enum {
  NF_GEN_TEMPERATURE = 1,
  NF_GEN_TOP_P = 2,
  NF_GEN_TOP_K = 4,
  NF_GEN_MIN_P = 8
};
typedef struct nf_generation_defaults {
  unsigned set;
  float temperature;
  float top_p;
  int32_t top_k;
  float min_p;
} nf_generation_defaults;
NF_API nf_generation_defaults
nf_model_generation_defaults(const nf_model *model);
/* Sequences that may be alive at once. */
NF_API int32_t nf_model_max_sequences(const nf_model *model);
/* Tokens one sequence may hold; -1: unlimited (attention-free models). */
NF_API int64_t nf_model_max_context(const nf_model *model);
/* What the live sequences hold now: sequences alive (state slots in use),
   and the KV-cache pages of each attention layer in all, free, and their
   size in tokens (page ids are shared by the layers; a sequence of n tokens
   holds ceil(n / page size) pages). The KV counts are 0 for models without
   attention. A server reads them between steps to admit requests and to
   preempt before the cache runs out. */
NF_API int32_t nf_model_live_sequences(const nf_model *model);
NF_API int64_t nf_model_kv_pages(const nf_model *model);
NF_API int64_t nf_model_kv_free_pages(const nf_model *model);
NF_API int32_t nf_model_kv_page_size(const nf_model *model);
/* The memory of a sequence as the backend stores it: its recurrent state
   (every Mamba layer's, whatever its length), and one KV page of every
   attention layer (K and V; 0 without attention). */
NF_API int64_t nf_model_sequence_state_bytes(const nf_model *model);
NF_API int64_t nf_model_kv_page_bytes(const nf_model *model);
/* The backend running the model: "cpu" or "cuda". */
NF_API const char *nf_model_backend(const nf_model *model);
/* Nonzero when a tokenizer was loaded with the model. */
NF_API int nf_model_has_tokenizer(const nf_model *model);
/* Nonzero when the model has a chat template (nf_chat_apply_template). */
NF_API int nf_model_has_chat_template(const nf_model *model);
/* Why the chat template found next to the tokenizer cannot be used, one
   line naming the file (and the template line): "<file>: chat template line
   3: unexpected '}'"; "" when the model has a template, or none was found.
   Valid until the model is freed. */
NF_API const char *nf_model_chat_template_error(const nf_model *model);
/* A readable multi-line summary ("key: value" lines). Valid until the model
   is freed. */
NF_API const char *nf_model_info(const nf_model *model);

/* ------------------------------------------------------------------------ */
/* Tokenizer (byte-level BPE from tokenizer.json)                           */

/* Token ids of the UTF-8 text text[0..len). `add_special` applies the
   tokenizer's post-processor (e.g. a BOS template). Writes at most `cap` ids
   to `out` and their count to *n_out. NF_ERR_UNSUPPORTED when the model has
   no tokenizer. */
NF_API nf_status nf_tokenize(const nf_model *model, const char *text,
                             size_t len, int add_special, int32_t *out,
                             size_t cap, size_t *n_out);

enum {
  /* Leave special tokens (BOS, EOS, ...) out of the text. */
  NF_DETOKENIZE_SKIP_SPECIAL = 1,
  /* Raw bytes without UTF-8 repair (for streaming, where a character may be
     split between calls); otherwise invalid sequences become U+FFFD. */
  NF_DETOKENIZE_RAW_BYTES = 2
};

/* The text of tokens[0..n) (`flags`: NF_DETOKENIZE_*). Writes the bytes to
   `out` and their count to *n_out, plus a terminating NUL when cap > *n_out.
   Unknown ids are skipped. */
NF_API nf_status nf_detokenize(const nf_model *model, const int32_t *tokens,
                               size_t n, int flags, char *out, size_t cap,
                               size_t *n_out);

/* ------------------------------------------------------------------------ */
/* Chat templates (Hugging Face Jinja chat templates)                       */

/* One message of a conversation: NUL-terminated UTF-8 strings (so neither
   can hold a NUL character: callers with text from elsewhere, JSON's
   "\u0000" for one, must refuse it or lose what follows). */
typedef struct nf_chat_message {
  const char *role; /* "system", "user", "assistant", ... */
  const char *content;
} nf_chat_message;

/* The prompt text of messages[0..n_messages), rendered with the model's chat
   template as transformers' apply_chat_template renders it: the messages as
   a list of {"role", "content"}, add_generation_prompt, tools and documents
   None, and the special tokens of tokenizer_config.json (bos_token,
   eos_token, ...; without that file, bos_token and eos_token are the
   tokenizer's texts of nf_model_bos and nf_model_eos when those are special
   tokens). Templates write the BOS themselves: tokenize the text with
   add_special 0. Writes the bytes to `out` and their count to *n_out, plus
   a terminating NUL when cap > *n_out (a too small `cap`:
   NF_ERR_BUFFER_TOO_SMALL with the size needed in *n_out). Each call renders
   anew, and two renders of one conversation may differ (strftime_now()
   writes the current time): after NF_ERR_BUFFER_TOO_SMALL, call again with
   at least *n_out bytes until it fits. Errors: NF_ERR_UNSUPPORTED without a
   usable chat template (nf_last_error() says why: none found, or the
   reason of nf_model_chat_template_error); NF_ERR_INVALID_ARGUMENT for NULL
   pointers, text that is not UTF-8, or a template that fails on these
   messages, e.g. by raise_exception("Conversation roles must alternate
   ..."), or passes the renderer's bounds on work and sizes: nf_last_error()
   then holds the template's message and line. */
NF_API nf_status nf_chat_apply_template(const nf_model *model,
                                        const nf_chat_message *messages,
                                        size_t n_messages,
                                        int add_generation_prompt, char *out,
                                        size_t cap, size_t *n_out);
/* nf_chat_apply_template with more template variables: `variables_json`
   (NULL or "" for none) is a JSON object whose members the template sees as
   variables, as keyword arguments of apply_chat_template, e.g.
   {"enable_thinking": false}. They override tools, documents and the
   special tokens; "messages" and "add_generation_prompt", or text that is
   not a JSON object: NF_ERR_INVALID_ARGUMENT. */
/* nf_chat_apply_template_vars with the messages as a JSON array of objects,
   as OpenAI's API and transformers give them: a "role" string each, and
   "content", "tool_calls" (with "arguments" as objects), "tool_call_id",
   "reasoning_content", ... passed to the template as they are. Text that is
   not such an array: NF_ERR_INVALID_ARGUMENT. */
NF_API nf_status nf_chat_apply_template_json(
    const nf_model *model, const char *messages_json, int add_generation_prompt,
    const char *variables_json, char *out, size_t cap, size_t *n_out);
NF_API nf_status nf_chat_apply_template_vars(
    const nf_model *model, const nf_chat_message *messages, size_t n_messages,
    int add_generation_prompt, const char *variables_json, char *out,
    size_t cap, size_t *n_out);

/* ------------------------------------------------------------------------ */
/* Sequences and steps                                                      */

/* A new empty sequence (fresh recurrent state, empty KV cache).
   NF_ERR_CAPACITY when all sequence slots are in use. */
NF_API nf_status nf_seq_add(nf_model *model, int32_t *seq_id);
/* A new sequence that continues from `seq_id` as it is now (which is left
   unchanged): the same length, a copy of its recurrent state, and its K/V
   cache (full pages shared, the last partly filled page copied), so that
   several continuations of one prefix need it computed once.
   NF_ERR_CAPACITY when no sequence slot (or KV page for the copy) is free;
   NF_ERR_INVALID_ARGUMENT for an unknown id. */
NF_API nf_status nf_seq_fork(nf_model *model, int32_t seq_id,
                             int32_t *fork_id);
/* Frees the sequence's state (KV pages a fork shares stay with it). */
NF_API nf_status nf_seq_remove(nf_model *model, int32_t seq_id);
/* Tokens the sequence holds so far; -1 for an unknown id. */
NF_API int64_t nf_seq_length(const nf_model *model, int32_t seq_id);
/* KV pages that only the `n` given sequences hold (pages they share with
   other sequences are not counted): what removing them all frees. Unknown
   ids count nothing. In a tiered cache (nfc --kv-hot-window) the count is
   of storage units, nf_model_kv_page_bytes each: a hot (bf16) page is
   two. */
NF_API nf_status nf_seq_exclusive_pages(const nf_model *model,
                                        const int32_t *seq_ids, int32_t n,
                                        int64_t *pages);

/* The tokens one sequence contributes to a step. */
typedef struct nf_seq_input {
  int32_t seq_id;
  /* Appended at the sequence's current length; n_tokens >= 1. */
  const int32_t *tokens;
  int32_t n_tokens;
  /* Fraction of the static top-k expert FLOPs to spend on these tokens
     (plans compiled with the "budget" expert policy); <= 0: the plan's
     default budget. */
  float expert_budget;
  /* > 0: run exactly this many routed experts per token (static top-k
     override, e.g. for evaluation); 0: the plan's policy. */
  int32_t experts_per_token;
} nf_seq_input;

typedef struct nf_batch {
  const nf_seq_input *seqs; /* each sequence at most once */
  int32_t n_seqs;
  /* Optional output, NULL or n_seqs entries: routed-expert calls of each
     sequence in this step, summed over MoE layers. 0 where the backend
     cannot count them (CUDA plans whose kernels keep the expert selection
     to themselves: nf_model_info says "no expert statistics"). */
  int64_t *expert_calls;
  /* Optional output, NULL or n_seqs * nf_model_n_moe_layers() entries: the
     same per MoE layer, row-major [sequence][MoE layer] (a row sums to the
     sequence's expert_calls). */
  int64_t *expert_calls_per_layer;
} nf_batch;

/* Runs one step over the batch. Logits (f32) are written row-major to
   `logits_out`: with `logits_all` one row of nf_model_vocab_size() floats per
   token of the step (sequences in batch order, tokens in order), otherwise
   one row per sequence (its last token). `logits_out` may be NULL (no logits
   wanted: none are copied back from the device); otherwise `logits_cap` (in
   floats) must hold every row, checked
   before anything runs. On failure the sequences' state is unspecified:
   remove them. */
NF_API nf_status nf_decode(nf_model *model, const nf_batch *batch,
                           float *logits_out, size_t logits_cap,
                           int logits_all);

/* ------------------------------------------------------------------------ */
/* Sampling                                                                 */

/* The logits are divided by `temperature` and turned into probabilities;
   then top-k, top-p and min-p keep a subset (in that order) and the token is
   drawn from the renormalised kept probabilities. */
typedef struct nf_sampler_params {
  /* 0: greedy (argmax, lowest id on ties; no random draw). > 0 otherwise. */
  float temperature;
  /* Keep the k most probable tokens (ties: lower ids first); 0: off. */
  int32_t top_k;
  /* Keep the smallest set of most probable tokens whose probability sums to
     at least top_p; in (0, 1], 1: off. */
  float top_p;
  /* Keep tokens whose probability is at least min_p times the largest
     probability; in [0, 1], 0: off. */
  float min_p;
  /* Seed of the sampler's random stream (Philox4x32-10 noise of (seed,
     draw, token), the Gumbel-max rule): equal seeds, parameters and logits
     give equal tokens, on every backend. */
  uint64_t seed;
} nf_sampler_params;

typedef struct nf_sampler nf_sampler;

/* Greedy: temperature 0, top_k 0, top_p 1, min_p 0, seed 0. */
NF_API nf_sampler_params nf_sampler_default_params(void);
/* NF_ERR_INVALID_ARGUMENT for parameters out of range. */
NF_API nf_status nf_sampler_create(const nf_sampler_params *params,
                                   nf_sampler **out);
NF_API void nf_sampler_free(nf_sampler *sampler);
/* Restarts the random stream from `seed`. */
NF_API void nf_sampler_reseed(nf_sampler *sampler, uint64_t seed);
/* The next token drawn from logits[0..n_vocab); NaN logits count as -inf.
   -1 on failure (NULL pointers, n_vocab <= 0, no finite logit): see
   nf_last_error(). */
NF_API int32_t nf_sample(nf_sampler *sampler, const float *logits,
                         int32_t n_vocab);

/* Runs one step over the batch, as nf_decode, and draws each sequence's
   next token from its last token's logits with samplers[i] into
   tokens_out[i] (n_seqs entries each): the tokens nf_sample would draw from
   the rows nf_decode returns. On CUDA decode steps of plans that rank
   logits on the device (nf_model_info), only each row's 64 best come back,
   not the row, where every sampler can draw from them: greedy, top-k below
   64, min-p alone and (plans of format 1.7, with the row's total) top-p
   without top-k,
   on steps whose rows hold 32,768 logits or more (vocabulary times
   sequences); and temperature alone (format 1.7: the best keys of the
   sampler's draw) at any size. A sampler may serve several entries (drawn
   in entry order). A sequence whose sampler finds no logit above -inf gets
   -1 and the call still returns NF_OK (the step has run; nf_last_error()
   then names the entry). samplers[i] may be NULL: entry i runs in the step
   but nothing is drawn for it (tokens_out[i] = -1; a prompt fed in chunks,
   whose last-token logits are not wanted before its last chunk). Other
   failures, including the device's, return an error status. */
NF_API nf_status nf_decode_sample(nf_model *model, const nf_batch *batch,
                                  nf_sampler *const *samplers,
                                  int32_t *tokens_out);

/* ------------------------------------------------------------------------ */
/* Generation                                                               */

typedef struct nf_generate_params {
  /* Most tokens to generate (stop token included). */
  int32_t max_tokens;
  nf_sampler_params sampler;
  /* Generation stops after producing one of these tokens (it is kept in the
     output), ... */
  const int32_t *stop_tokens;
  size_t n_stop_tokens;
  /* ... or one of the model's EOS tokens, unless ignore_eos is nonzero. */
  int ignore_eos;
  /* As nf_seq_input.expert_budget; <= 0: the plan's default. */
  float expert_budget;
} nf_generate_params;

/* max_tokens 128, greedy sampling, no extra stop tokens, stop at EOS. */
NF_API nf_generate_params nf_generate_default_params(void);

/* Called once per generated token, in order. `piece`/`piece_len`: the new
   bytes of the generated text (raw, so a UTF-8 character may be split
   between calls; special tokens add nothing); NULL/0 without a tokenizer.
   Return nonzero to stop after this token. */
typedef int (*nf_token_callback)(int32_t token, const char *piece,
                                 size_t piece_len, void *user_data);

/* Generates a continuation of prompt[0..n_prompt) in a sequence of its own
   (added and removed here; other sequences are untouched). Writes the
   generated tokens to `out` (at most `cap`; generation stops when it is full)
   and their count to *n_out. `params` and `callback` may be NULL. */
NF_API nf_status nf_generate(nf_model *model, const int32_t *prompt,
                             size_t n_prompt, const nf_generate_params *params,
                             nf_token_callback callback, void *user_data,
                             int32_t *out, size_t cap, size_t *n_out);

/* ------------------------------------------------------------------------ */
/* Text streams                                                             */

/* Generated tokens as the text a client may see, piece by piece: each
   token's bytes decoded in context (as one decode of the whole text would
   write them, special tokens skipped), cut before the first stop string,
   and held back while the text ends with what may begin a stop string or
   with part of a UTF-8 character. The serving engine's requests use it;
   so can any front end that samples tokens itself. */
typedef struct nf_text_stream nf_text_stream;

/* A stream of `model`'s tokenizer (which must outlive it) with stop strings
   stops[0..n_stops) (NUL-terminated, not empty). NF_ERR_UNSUPPORTED when the
   model has no tokenizer. */
NF_API nf_status nf_text_stream_create(const nf_model *model,
                                       const char *const *stops,
                                       size_t n_stops, nf_text_stream **out);
NF_API void nf_text_stream_free(nf_text_stream *stream);
/* Adds a generated token, then points *text at the bytes that became
   visible (*len of them; valid until the next call on the stream). With
   `final` nonzero (the last token, or 0 tokens: pass token -1) nothing is
   held back. *stopped (may be NULL) becomes nonzero when a stop string now
   ends the text: add no more tokens. */
NF_API nf_status nf_text_stream_add(nf_text_stream *stream, int32_t token,
                                    int final, const char **text, size_t *len,
                                    int *stopped);

/* ------------------------------------------------------------------------ */
/* Serving engine                                                           */

/* Runs many requests over one model in shared steps (continuous batching)
   on a thread of its own: each step holds the running requests' next
   tokens, then prompt chunks up to a token budget (chunked prefill), so a
   long prompt never stalls the streams already running. Waiting requests
   are admitted by priority, then arrival, when a sequence slot is free and
   the KV cache can hold the request's whole context; when the running
   requests need more KV pages than are free, the running request of the
   lowest priority admitted last is preempted (its pages freed, its prompt
   and generated tokens recomputed when it is admitted again): no accepted
   request fails for lack of memory. Each request yields its tokens and its
   text (nf_text_stream's) as they come, then how it finished, its usage
   and timings.

   The engine has the model's steps to itself: a model has at most one
   engine at a time, and while it exists do not call nf_seq_*, nf_decode,
   nf_decode_sample or nf_generate on the model. Calls that read what does
   not change stay allowed (nf_tokenize, nf_detokenize,
   nf_chat_apply_template, the model's sizes and names); the counts that
   steps change (live sequences, KV pages, expert utilisation) are read
   through the engine instead (nf_engine_get_stats,
   nf_engine_expert_utilization). Engine and request calls are
   thread-safe. */
typedef struct nf_engine nf_engine;
typedef struct nf_request nf_request;

typedef enum nf_finish_reason {
  NF_FINISH_NONE = 0, /* still running */
  /* An EOS token (unless ignored), a stop token or a stop string. */
  NF_FINISH_STOP = 1,
  /* max_tokens (or the soft limit granted), or the model's context. */
  NF_FINISH_LENGTH = 2,
  NF_FINISH_CANCELLED = 3, /* nf_request_cancel */
  NF_FINISH_ERROR = 4,     /* the request failed: the output's error */
  /* The engine shut down (or was freed) before the request finished. */
  NF_FINISH_UNAVAILABLE = 5
} nf_finish_reason;

/* "stop", "length", "cancelled", "error" or "unavailable"; NULL for
   NF_FINISH_NONE. */
NF_API const char *nf_finish_reason_string(nf_finish_reason reason);

typedef enum nf_engine_event_kind {
  NF_EVENT_STEP = 0,        /* a step ran */
  NF_EVENT_FIRST_TOKEN = 1, /* a request's first token */
  NF_EVENT_TOKEN = 2,       /* a request's later tokens, one by one */
  NF_EVENT_FINISHED = 3,    /* a request ended */
  NF_EVENT_PREEMPTED = 4    /* a request gave its sequence up */
} nf_engine_event_kind;

/* What the engine reports to its observer (for metrics). */
typedef struct nf_engine_event {
  nf_engine_event_kind kind;
  /* The request's user_data (NULL for steps). */
  void *request_user_data;
  /* FIRST_TOKEN: seconds since submission; TOKEN: since the request's
     previous token; FINISHED: since submission; STEP: the step's. */
  double seconds;
  /* FINISHED: how, and the request's tokens. */
  nf_finish_reason finish_reason;
  int64_t prompt_tokens;
  int64_t completion_tokens;
  /* STEP: sequences and tokens in it; STEP and FINISHED: routed-expert
     calls (of the step; of the request), 0 where the backend cannot count
     them. */
  int32_t step_sequences;
  int64_t step_tokens;
  int64_t expert_calls;
  /* FINISHED: the request's expert_budget (<= 0: the plan's default). */
  float expert_budget;
} nf_engine_event;

/* Called on the engine's thread (for requests that nf_engine_free ends, on
   the thread freeing it), with no lock of the engine held: it must return
   quickly, must not throw, and must not call the engine. A request's
   user_data must stay valid until its FINISHED event, which may come after
   nf_request_free (the request ends at the engine's next step). */
typedef void (*nf_engine_observer)(const nf_engine_event *event,
                                   void *user_data);

typedef struct nf_engine_params {
  /* Requests running at once; 0: the model's nf_model_max_sequences(). */
  int32_t max_batch;
  /* Requests waiting to be admitted; a submission beyond gets
     NF_ERR_CAPACITY. 0: the default, 256. */
  int32_t max_queue;
  /* Tokens of one step: running requests' next tokens, then prompt chunks
     (vLLM's max_num_batched_tokens). Default 2048; at least max_batch. */
  int64_t max_batched_tokens;
  /* A hard limit on every request's max_tokens (a request asking for more
     is refused); 0: none. */
  int32_t max_new_tokens;
  /* > 0: a request waiting this long is admitted before any other waiting
     request of better priority (so low priority cannot starve); 0: off. */
  int64_t max_wait_ms;
  nf_engine_observer observer; /* may be NULL */
  void *observer_data;
  /* Prefix caching (default on): a request whose context starts with
     tokens a recent request processed continues from a snapshot of that
     request's sequence (Mamba state and K/V) instead of computing them
     again. Snapshots are kept at the last multiple of prefix_cache_block
     tokens before a prompt's last token, at the token before it, and at
     the end of each request that finished; they use sequence slots and KV
     pages that running requests do not, and give them up, least recently
     used first, before a request would wait or be preempted for them. */
  int32_t prefix_caching;
  int32_t prefix_cache_block; /* tokens; 0: the default, 256 */
} nf_engine_params;

NF_API nf_engine_params nf_engine_default_params(void);
/* Starts an engine over `model`, which must outlive it. */
NF_API nf_status nf_engine_create(nf_model *model,
                                  const nf_engine_params *params,
                                  nf_engine **out);
/* Stops the engine's thread; requests still running or waiting end with
   NF_FINISH_UNAVAILABLE (their handles stay readable until freed). */
NF_API void nf_engine_free(nf_engine *engine);

/* The most alternatives a position's logprobs may list (vLLM's default
   max_logprobs). */
#define NF_MAX_TOP_LOGPROBS 20

/* Structured output (nf_request_params.grammar_kind): what the generated
   text must match. */
typedef enum nf_grammar_kind {
  NF_GRAMMAR_NONE = 0,
  NF_GRAMMAR_JSON = 1,           /* any JSON object */
  NF_GRAMMAR_JSON_SCHEMA = 2,    /* grammar: a JSON schema */
  NF_GRAMMAR_REGEX = 3,          /* grammar: a regular expression */
  NF_GRAMMAR_EBNF = 4,           /* grammar: EBNF (XGrammar's), rule root */
  NF_GRAMMAR_STRUCTURAL_TAG = 5  /* grammar: an XGrammar structural tag */
} nf_grammar_kind;

/* nf_request_params.grammar_flags. */
/* JSON kinds: no whitespace between tokens other than the separators ", "
   and ": " (vLLM's disable_any_whitespace); by default any whitespace is
   allowed there, which some models fill without end. */
#define NF_GRAMMAR_FLAG_NO_WHITESPACE 1u

typedef struct nf_request_params {
  const int32_t *prompt; /* n_prompt >= 1 token ids of the vocabulary */
  size_t n_prompt;
  /* Most tokens to generate; <= 0: up to max_new_tokens, else the
     context. Always cut to the context left after the prompt. */
  int32_t max_tokens;
  /* > 0: a soft limit: at admission the engine grants min(max_tokens_soft,
     the tokens the free KV cache holds for this request beside those
     admitted before it), at least 1 (the output's max_tokens says what it
     granted). 0: off. */
  int32_t max_tokens_soft;
  nf_sampler_params sampler;
  /* Stop strings (NUL-terminated, not empty): the text ends before the
     first one (NF_FINISH_STOP). */
  const char *const *stop_strings;
  size_t n_stop_strings;
  /* Stop tokens: generation ends after one (it is in the tokens, not the
     text). */
  const int32_t *stop_tokens;
  size_t n_stop_tokens;
  int ignore_eos;
  /* Lower values are admitted first and preempted last (vLLM's priority);
     default 0. */
  int32_t priority;
  /* As nf_seq_input.expert_budget; <= 0: the plan's default. */
  float expert_budget;
  /* Handed to the engine's observer with this request's events. */
  void *user_data;
  /* Prefix caching: only snapshots made under the same salt serve the
     request (so tenants cannot learn each other's prompts from timing).
     NULL or "": the shared, unsalted cache. */
  const char *cache_salt;
  /* Nonzero: each generated token's log-probability, with top_logprobs (0
     to NF_MAX_TOP_LOGPROBS) most probable alternatives. They are the
     model's: log-softmax of the logits the token is drawn from, before
     temperature and filters (as vLLM's default raw_logprobs). */
  int32_t logprobs;
  int32_t top_logprobs;
  /* Nonzero: the same for every prompt token after the first (under the
     logits of the token before it), with prompt_top_logprobs (0 to
     NF_MAX_TOP_LOGPROBS) alternatives. The request then computes its whole
     prompt: no prefix-cache snapshot serves it. */
  int32_t prompt_logprobs;
  int32_t prompt_top_logprobs;
  /* Penalties on the logits each token is drawn from, as vLLM applies
     them (after min_tokens and logit_bias; logprobs stay the model's):
     presence_penalty and frequency_penalty, in [-2, 2], are subtracted
     from the logit of every token generated so far, once and once per
     time it was generated; repetition_penalty (> 0; 0 and 1: off) divides
     the positive logits of the prompt's and the output's tokens and
     multiplies their negative ones. */
  float presence_penalty;
  float frequency_penalty;
  float repetition_penalty;
  /* Added to the logits of their tokens (OpenAI's logit_bias): n_logit_bias
     pairs, biases in [-100, 100]. */
  const int32_t *logit_bias_tokens;
  const float *logit_bias_values;
  size_t n_logit_bias;
  /* The model's EOS tokens and the stop tokens cannot be drawn before this
     many tokens are generated. */
  int32_t min_tokens;
  /* Structured output by constrained decoding (XGrammar): before each
     draw, every token that cannot continue a match of `grammar` is
     masked, and the model's EOS and the stop tokens can be drawn only
     where the match is complete. A generation cut by max_tokens may end
     mid-match. An invalid grammar fails the submit
     (NF_ERR_INVALID_ARGUMENT, naming the problem); a model without a
     tokenizer cannot be constrained (NF_ERR_UNSUPPORTED). */
  int32_t grammar_kind; /* an nf_grammar_kind (an int: any value is checked) */
  const char *grammar;  /* NUL-terminated; ignored for NONE and JSON */
  uint32_t grammar_flags; /* NF_GRAMMAR_FLAG_* */
  /* n_grammar_after > 0: the grammar applies only after the output has
     contained these tokens (the end of a reasoning block, as `</think>`:
     the model reasons freely, then answers in the grammar). */
  const int32_t *grammar_after;
  size_t n_grammar_after;
  /* Nonzero: the text keeps special tokens' text (vLLM's
     skip_special_tokens false); the tokens that end the request (EOS, stop
     tokens) still add none. */
  int keep_special_tokens;
  /* Nonzero: a stop string ends the text after it instead of before it
     (vLLM's include_stop_str_in_output). */
  int include_stop_str;
} nf_request_params;

/* max_tokens 16, greedy, no stops, priority 0. */
NF_API nf_request_params nf_request_default_params(void);

/* Queues a request; everything in `params` is copied. Errors:
   NF_ERR_INVALID_ARGUMENT (an empty prompt, a token outside the vocabulary,
   a prompt that fills the context, max_tokens above max_new_tokens, bad
   sampler parameters, an empty stop string), NF_ERR_CAPACITY (the queue is
   full: retry later), NF_ERR_UNAVAILABLE (the engine is shutting down). */
NF_API nf_status nf_engine_submit(nf_engine *engine,
                                  const nf_request_params *params,
                                  nf_request **out);

/* What a request produced since the last read, and, once finished, how it
   ended. The pointers stay valid until the next read of the request or
   its free. */
typedef struct nf_request_output {
  const int32_t *tokens; /* new generated token ids */
  size_t n_tokens;
  const char *text; /* new visible text (raw UTF-8 bytes) */
  size_t text_len;
  nf_finish_reason finish_reason; /* NF_FINISH_NONE while running */
  const char *error;              /* "" unless ERROR or UNAVAILABLE */
  /* Usage so far. */
  int64_t prompt_tokens;
  int64_t completion_tokens;
  /* The limit the request runs under (the soft limit granted); 0 until it
     is admitted. */
  int32_t max_tokens;
  int32_t preemptions;
  /* Routed-expert calls of the request's tokens (prefill and decode, steps
     run again after a preemption included), summed over MoE layers (0
     where the backend cannot count them), and per MoE layer (n_moe_layers
     entries, in layer order; they sum to expert_calls). */
  int64_t expert_calls;
  const int64_t *expert_calls_per_layer;
  int32_t n_moe_layers;
  /* The expert budget the request runs with (the plan's default where it
     gave none), and the share of static top-k's routed-expert calls it
     spent on the tokens it ran: expert_calls / (k * MoE layers * tokens);
     0 without MoE or expert counts. */
  float expert_budget;
  double expert_budget_spent;
  /* Seconds from submission to its first step, from then to its first
     token, and from then to its end (final once finished). */
  double queued_s;
  double prefill_s;
  double decode_s;
  /* Prompt tokens taken from the prefix cache instead of computed (at its
     last admission). */
  int64_t cached_tokens;
  /* With logprobs: per new token, its log-probability (n_tokens entries),
     and n_top_logprobs alternatives each: top_logprob_tokens and
     top_logprobs ([token][n_top_logprobs], most probable first, lower ids
     first among equals; -1 and -inf past the vocabulary). NULL otherwise. */
  const float *token_logprobs;
  const int32_t *top_logprob_tokens;
  const float *top_logprobs;
  int32_t n_top_logprobs;
  /* With prompt_logprobs: the positions of the prompt (1, 2, ... in
     order; all of them by the read that brings the first token) that this
     read brings: n_prompt_logprobs of them, each its token, its
     log-probability and n_prompt_top_logprobs alternatives, laid out as
     above. */
  const int32_t *prompt_logprob_tokens;
  const float *prompt_logprobs;
  size_t n_prompt_logprobs;
  const int32_t *prompt_top_logprob_tokens;
  const float *prompt_top_logprobs;
  int32_t n_prompt_top_logprobs;
} nf_request_output;

/* Waits up to timeout_ms (0: does not wait; < 0: without limit) for new
   tokens or the end, then fills *out (with nothing new after a timeout).
   One reader at a time. */
NF_API nf_status nf_request_read(nf_request *request, int32_t timeout_ms,
                                 nf_request_output *out);
/* Ends the request (NF_FINISH_CANCELLED) at the engine's next step; its
   sequence is freed. Callable from any thread. */
NF_API void nf_request_cancel(nf_request *request);
/* Cancels the request if it is still running and frees the handle. */
NF_API void nf_request_free(nf_request *request);

/* Stops admitting: waiting requests end NF_FINISH_UNAVAILABLE at once,
   submissions get NF_ERR_UNAVAILABLE, running requests (and those
   preempted on their way) may finish for grace_ms (at most 1e9), then end
   NF_FINISH_UNAVAILABLE. */
NF_API void nf_engine_shutdown(nf_engine *engine, int64_t grace_ms);

typedef struct nf_engine_stats {
  int32_t waiting;  /* queued and preempted requests */
  int32_t running;  /* requests holding a sequence */
  int32_t peak_batch;
  int32_t live_sequences;  /* nf_model_live_sequences */
  int64_t kv_pages;        /* 0 without attention */
  int64_t kv_free_pages;
  int64_t preemptions;     /* since the start */
  int64_t steps;
  int32_t draining;        /* nonzero after nf_engine_shutdown */
  int32_t drained;         /* ... and every request has ended */
  /* Prefix caching: context tokens of admitted requests looked up, those
     taken from a snapshot, snapshots held now (each a live sequence) and
     given up since the start. */
  int64_t prefix_cache_queries;
  int64_t prefix_cache_hits;
  int32_t prefix_cache_entries;
  int64_t prefix_cache_evictions;
  /* The memory the snapshots hold alone (their recurrent state, and KV
     pages no running request shares), recounted when snapshots come or
     go and when the last running request ends, else every 250 ms. */
  int64_t prefix_cache_bytes;
} nf_engine_stats;

NF_API nf_status nf_engine_get_stats(nf_engine *engine, nf_engine_stats *out);

/* Frees every prefix-cache snapshot (their slots and pages) at the
   engine's next step; requests running keep their sequences. */
NF_API void nf_engine_reset_prefix_cache(nf_engine *engine);

/* nf_model_expert_utilization of the engine's model, as of its last step
   (the model's own counters are the engine thread's while it runs). */
NF_API nf_status nf_engine_expert_utilization(nf_engine *engine,
                                              int64_t *counts, size_t cap);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NF_NF_H */
