/* The C API from C99: load a plan, run a prompt through nf_decode step by
 * step with a greedy sampler, check a few error paths, and round-trip text
 * through the tokenizer when the model has one.
 *
 *   embed_c PLAN [WEIGHTS_DIR]
 */
#include <nf/nf.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                            \
  do {                                                                         \
    nf_status s_ = (call);                                                     \
    if (s_ != NF_OK) {                                                         \
      fprintf(stderr, "embed_c: %s: %s: %s\n", #call, nf_status_string(s_),    \
              nf_last_error());                                                \
      return 1;                                                                \
    }                                                                          \
  } while (0)

#define EXPECT(cond)                                                           \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "embed_c: expectation failed: %s (%s)\n", #cond,         \
              nf_last_error());                                                \
      return 1;                                                                \
    }                                                                          \
  } while (0)

int main(int argc, char **argv) {
  nf_model_params params;
  nf_model *model = NULL;
  nf_sampler *sampler = NULL, *invalid = NULL;
  nf_sampler_params sp;
  nf_seq_input in;
  nf_batch batch;
  float *logits;
  int32_t vocab, seq, token, bad;
  int32_t generated[8];
  int64_t calls = -1;
  int i;

  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: embed_c PLAN [WEIGHTS_DIR]\n");
    return 2;
  }

  /* Errors are status codes with a message, never crashes. */
  EXPECT(nf_model_load("/nonexistent/model.nfb", NULL, &model) == NF_ERR_LOAD);
  EXPECT(model == NULL && strlen(nf_last_error()) > 0);
  printf("expected error: %s\n", nf_last_error());

  params = nf_model_default_params();
  params.weights_dir = argc > 2 ? argv[2] : NULL;
  params.max_sequences = 2;
  CHECK(nf_model_load(argv[1], &params, &model));
  vocab = nf_model_vocab_size(model);
  printf("model %s: vocab %d, layers %s, experts/token %d\n",
         nf_model_name(model), (int)vocab, nf_model_layer_pattern(model),
         (int)nf_model_experts_per_token(model));

  sp = nf_sampler_default_params(); /* greedy */
  CHECK(nf_sampler_create(&sp, &sampler));
  sp.top_p = 2.0f;
  EXPECT(nf_sampler_create(&sp, &invalid) == NF_ERR_INVALID_ARGUMENT);
  EXPECT(invalid == NULL);

  CHECK(nf_seq_add(model, &seq));
  EXPECT(nf_seq_length(model, seq) == 0);
  token = nf_model_bos(model) >= 0 ? nf_model_bos(model) : 1;
  in.seq_id = seq;
  in.tokens = &token;
  in.n_tokens = 1;
  in.expert_budget = 0.0f;
  in.experts_per_token = 0;
  batch.seqs = &in;
  batch.n_seqs = 1;
  batch.expert_calls = &calls;
  batch.expert_calls_per_layer = NULL;
  logits = (float *)malloc(sizeof(float) * (size_t)vocab);
  if (!logits)
    return 1;

  /* Checked before anything runs: too small a buffer, a bad token. */
  EXPECT(nf_decode(model, &batch, logits, (size_t)vocab - 1, 0) ==
         NF_ERR_BUFFER_TOO_SMALL);
  bad = vocab;
  in.tokens = &bad;
  EXPECT(nf_decode(model, &batch, logits, (size_t)vocab, 0) ==
         NF_ERR_INVALID_ARGUMENT);
  in.tokens = &token;
  EXPECT(nf_seq_length(model, seq) == 0);

  for (i = 0; i < 8; ++i) {
    CHECK(nf_decode(model, &batch, logits, (size_t)vocab, 0));
    generated[i] = nf_sample(sampler, logits, vocab);
    EXPECT(generated[i] >= 0 && generated[i] < vocab);
    token = generated[i];
  }
  EXPECT(nf_seq_length(model, seq) == 8);
  printf("greedy:");
  for (i = 0; i < 8; ++i)
    printf(" %d", (int)generated[i]);
  printf(" (expert calls in the last step: %lld)\n", (long long)calls);
  CHECK(nf_seq_remove(model, seq));
  EXPECT(nf_seq_length(model, seq) == -1);
  EXPECT(nf_seq_remove(model, seq) == NF_ERR_INVALID_ARGUMENT);

  /* No logits buffer: the step runs and the sequence advances, but no
     logits come back; the next step continues the same history. */
  CHECK(nf_seq_add(model, &seq));
  in.seq_id = seq;
  token = nf_model_bos(model) >= 0 ? nf_model_bos(model) : 1;
  CHECK(nf_decode(model, &batch, NULL, 0, 0));
  EXPECT(nf_seq_length(model, seq) == 1);
  token = generated[0];
  CHECK(nf_decode(model, &batch, logits, (size_t)vocab, 0));
  EXPECT(nf_sample(sampler, logits, vocab) == generated[1]);
  CHECK(nf_seq_remove(model, seq));

  if (nf_model_has_tokenizer(model)) {
    const char *text = "def main():";
    int32_t ids[64];
    char back[128];
    size_t n = 0, len = 0;
    CHECK(nf_tokenize(model, text, strlen(text), 0, ids, 64, &n));
    EXPECT(nf_tokenize(model, text, strlen(text), 0, ids, 1, &len) ==
           NF_ERR_BUFFER_TOO_SMALL);
    EXPECT(len == n);
    CHECK(nf_detokenize(model, ids, n, NF_DETOKENIZE_SKIP_SPECIAL, back,
                        sizeof back, &len));
    EXPECT(len == strlen(text) && strcmp(back, text) == 0);
    printf("tokenizer: '%s' -> %zu tokens -> '%s'\n", text, n, back);
  } else {
    int32_t ids[4];
    size_t n = 0;
    EXPECT(nf_tokenize(model, "x", 1, 0, ids, 4, &n) == NF_ERR_UNSUPPORTED);
  }

  free(logits);
  nf_sampler_free(sampler);
  nf_model_free(model);
  printf("embed_c: ok\n");
  return 0;
}
