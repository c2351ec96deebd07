/* Host cost of sampling one token from a full row of logits (nf_sample),
 * for a vocabulary of Nano's size (131,072), per sampler setting: what
 * `nfrun generate` and `serve` pay per sequence and step when the rows come
 * back from the device (samplers that cannot draw from the device's top
 * lists; docs/performance.md). Logits: a normal body with a few tokens far
 * above it, as a language model's, and a flat row (a random-weights model's:
 * top-p's nucleus is then most of the vocabulary).
 *
 *   gcc -O2 bench/sampling_host.c -I runtime/include -L build/lib -lnf -lm
 */
#include "nf/nf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(void) {
  const int V = 131072;
  float *l = malloc(sizeof(float) * V);
  srand(1);
  for (int i = 0; i < V; i++) {
    double u1 = (rand() + 1.0) / (RAND_MAX + 2.0);
    double u2 = (rand() + 1.0) / (RAND_MAX + 2.0);
    l[i] = (float)(2.0 * sqrt(-2 * log(u1)) * cos(6.2831853 * u2));
  }
  for (int i = 0; i < 20; i++)
    l[rand() % V] += 12.0f + i * 0.3f;
  float *flat = malloc(sizeof(float) * V);
  for (int i = 0; i < V; i++)
    flat[i] = 0.01f * (float)(rand() % 1000);
  struct {
    float t;
    int k;
    float p;
    int flat;
    const char *name;
  } modes[] = {{0, 0, 1, 0, "greedy"},
               {1, 0, 1, 0, "temperature 1"},
               {0.8f, 0, 0.95f, 0, "temperature 0.8, top-p 0.95"},
               {0.8f, 40, 1, 0, "temperature 0.8, top-k 40"},
               {0.8f, 40, 0.95f, 0, "temperature 0.8, top-k 40, top-p 0.95"},
               {0.8f, 0, 0.95f, 1, "flat row: temperature 0.8, top-p 0.95"}};
  printf("sampling one token from %d logits on the host (nf_sample):\n", V);
  for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
    nf_sampler_params p = nf_sampler_default_params();
    p.temperature = modes[m].t;
    p.top_k = modes[m].k;
    p.top_p = modes[m].p;
    p.seed = 7;
    nf_sampler *s = NULL;
    if (nf_sampler_create(&p, &s) != NF_OK)
      return 1;
    const int n = 40;
    const float *row = modes[m].flat ? flat : l;
    long sum = nf_sample(s, row, V); /* warm-up */
    double a = now_us();
    for (int i = 0; i < n; i++)
      sum += nf_sample(s, row, V);
    printf("  %-40s %8.1f us (token sum %ld)\n", modes[m].name,
           (now_us() - a) / n, sum);
    nf_sampler_free(s);
  }
  free(l);
  free(flat);
  return 0;
}
