/* Drives kiln.h the way a user's program would (tests/runtime/test_emit_c.py builds it with -std=c99
   -Wall -Wextra -Werror, and with AddressSanitizer and UBSan):
     capi_check run WEIGHTS IN_0 .. IN_n-1 OUT_0 .. OUT_m-1   raw bytes in, raw bytes out
     capi_check load WEIGHTS                                   prints the load's status and message
     capi_check misuse WEIGHTS                                 bad calls: each must give its status
     capi_check memory WEIGHTS IN_0 .. OUT_m-1                 as run, the weights loaded from memory
                                                               and the context on a workspace of its
                                                               own, after the bad calls of both */
#define _POSIX_C_SOURCE 200112L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

static int64_t batch = 1; /* run mode: the size of a dim described as -1 (argv: batch=N) */
static int64_t length = -1; /* run mode with len=M: the size of a -1 dim past axis 0 (a batch and a length) */
static int64_t workspace_length = 0; /* run mode with ws=M: a workspace of the caller's for runs up to length M */

static int64_t shapes[64][8]; /* the run's tensors' dims, -1 resolved */
static int used = 0;
static int64_t given[64][8]; /* run mode with shapes=AxB,CxDxE,...: each tensor's dims in order */
static int given_count = 0;

/* a -1 dim of the tensor about to be made (the `used`-th): its given shape's, else batch or length */
static int64_t resolved(const kiln_tensor_info *info, int d) {
  if (info->shape[d] >= 0) return info->shape[d];
  if (used < given_count) return given[used][d];
  return d > 0 && length >= 0 ? length : batch;
}

static int64_t count(const kiln_tensor_info *info) {
  int64_t n = 1;
  for (int d = 0; d < info->ndim; ++d) n *= resolved(info, d);
  return n;
}

static void *read_file(const char *path, size_t want) {
  FILE *f = fopen(path, "rb");
  void *data = malloc(want ? want : 1);
  if (!f || !data || fread(data, 1, want, f) != want) {
    fprintf(stderr, "cannot read %zu bytes of %s\n", want, path);
    exit(3);
  }
  fclose(f);
  return data;
}

static void tensor(DLTensor *t, const kiln_tensor_info *info, void *data) {
  memset(t, 0, sizeof *t);
  t->data = data;
  t->device.device_type = kDLCPU;
  t->ndim = info->ndim;
  t->dtype = info->dtype;
  t->shape = (int64_t *)info->shape;
  if (used < 64 && info->ndim <= 8) {
    for (int d = 0; d < info->ndim; ++d) shapes[used][d] = resolved(info, d);
    t->shape = shapes[used++];
  }
}

static int expect(const char *what, kiln_status got, kiln_status want) {
  printf("%s: status %d (%s)\n", what, (int)got, kiln_last_error());
  if (got != want) {
    printf("  expected status %d\n", (int)want);
    return 1;
  }
  if (want != KILN_OK && !kiln_last_error()[0]) {
    printf("  no message\n");
    return 1;
  }
  return 0;
}

static int misuse(kiln_model *model) {
  int failures = 0;
  kiln_tensor_info in0, out0;
  kiln_context *context = NULL;
  failures += expect("context", kiln_context_create(model, &context), KILN_OK);
  failures += expect("input -1", kiln_model_input(model, -1, &in0), KILN_ERROR_ARGUMENT);
  failures += expect("input 0", kiln_model_input(model, 0, &in0), KILN_OK);
  failures += expect("output 0", kiln_model_output(model, 0, &out0), KILN_OK);
  const int n_in = kiln_model_input_count(model), n_out = kiln_model_output_count(model);
  DLTensor *inputs = calloc((size_t)n_in, sizeof(DLTensor)), *outputs = calloc((size_t)n_out, sizeof(DLTensor));
  for (int i = 0; i < n_in; ++i) {
    kiln_tensor_info info;
    kiln_model_input(model, i, &info);
    tensor(&inputs[i], &info, calloc((size_t)count(&info), info.dtype.bits / 8));
  }
  for (int i = 0; i < n_out; ++i) {
    kiln_tensor_info info;
    kiln_model_output(model, i, &info);
    tensor(&outputs[i], &info, calloc((size_t)count(&info), info.dtype.bits / 8));
  }
  failures += expect("a good run", kiln_infer(context, inputs, n_in, outputs, n_out), KILN_OK);
  failures += expect("no context", kiln_infer(NULL, inputs, n_in, outputs, n_out), KILN_ERROR_ARGUMENT);
  failures += expect("one input short", kiln_infer(context, inputs, n_in - 1, outputs, n_out), KILN_ERROR_ARGUMENT);
  failures += expect("NULL inputs", kiln_infer(context, NULL, n_in, outputs, n_out), KILN_ERROR_ARGUMENT);
  void *data = inputs[0].data;
  inputs[0].data = NULL;
  failures += expect("NULL data", kiln_infer(context, inputs, n_in, outputs, n_out), KILN_ERROR_ARGUMENT);
  inputs[0].data = data;
  inputs[0].dtype.bits = in0.dtype.bits == 64 ? 32 : 64;
  failures += expect("wrong dtype", kiln_infer(context, inputs, n_in, outputs, n_out), KILN_ERROR_TENSOR);
  inputs[0].dtype = in0.dtype;
  int64_t shape[8] = {0}, *resolved = inputs[0].shape; /* (-1 dims resolved: the run's sizes) */
  memcpy(shape, resolved, sizeof(int64_t) * (size_t)in0.ndim);
  shape[0] += 1;
  inputs[0].shape = shape;
  failures += expect("wrong dims", kiln_infer(context, inputs, n_in, outputs, n_out), KILN_ERROR_TENSOR);
  inputs[0].shape = resolved;
  inputs[0].ndim = in0.ndim + 1;
  failures += expect("wrong rank", kiln_infer(context, inputs, n_in, outputs, n_out), KILN_ERROR_TENSOR);
  inputs[0].ndim = in0.ndim;
  int64_t strides[8] = {0};
  for (int d = 0; d < in0.ndim; ++d) strides[d] = 1;
  inputs[0].strides = strides;
  failures += expect(in0.ndim > 1 ? "not contiguous" : "strides of one dim", kiln_infer(context, inputs, n_in, outputs, n_out), in0.ndim > 1 ? KILN_ERROR_TENSOR : KILN_OK);
  inputs[0].strides = NULL;
  outputs[0].device.device_type = 2;
  failures += expect("a GPU output", kiln_infer(context, inputs, n_in, outputs, n_out), KILN_ERROR_TENSOR);
  outputs[0].device.device_type = kDLCPU;
  failures += expect("a good run again", kiln_infer(context, inputs, n_in, outputs, n_out), KILN_OK);
  if (in0.dtype.code == kDLInt && in0.dtype.bits == 64) { /* token ids: one out of the table's range */
    ((int64_t *)inputs[0].data)[0] = 1000000;
    failures += expect("an index out of range", kiln_infer(context, inputs, n_in, outputs, n_out), KILN_ERROR_RUN);
    ((int64_t *)inputs[0].data)[0] = 0;
    failures += expect("and a good run after it", kiln_infer(context, inputs, n_in, outputs, n_out), KILN_OK);
  }
  failures += expect("describe into NULL", kiln_model_input(model, 0, NULL), KILN_ERROR_ARGUMENT);
  kiln_context *other = context;
  failures += expect("no model", kiln_context_create(NULL, &other), KILN_ERROR_ARGUMENT);
  if (other) failures += expect("a failed create leaves NULL", KILN_ERROR_ARGUMENT, KILN_OK);
  kiln_context_free(other); /* (freeing NULL is allowed) */
  kiln_context_free(context);
  for (int i = 0; i < n_in; ++i) free(inputs[i].data);
  for (int i = 0; i < n_out; ++i) free(outputs[i].data);
  free(inputs), free(outputs);
  return failures;
}

/* the weights file's bytes in 64-byte aligned memory (*bytes: their count) */
static void *weights_in_memory(const char *path, size_t *bytes) {
  FILE *f = fopen(path, "rb");
  if (!f || fseek(f, 0, SEEK_END) != 0) exit(3);
  *bytes = (size_t)ftell(f);
  rewind(f);
  void *data = NULL;
  if (posix_memalign(&data, 64, *bytes + 64) != 0 || fread(data, 1, *bytes, f) != *bytes) exit(3);
  fclose(f);
  return data;
}

/* the bad calls of kiln_model_load_memory and kiln_context_create_in; *model: the good load */
static int memory_misuse(const char *path, kiln_model **model, void **data, void **workspace) {
  int failures = 0;
  size_t bytes = 0;
  *data = weights_in_memory(path, &bytes);
  kiln_model *other = NULL;
  failures += expect("memory: NULL data", kiln_model_load_memory(NULL, bytes, &other), KILN_ERROR_ARGUMENT);
  failures += expect("memory: not aligned", kiln_model_load_memory((char *)*data + 8, bytes, &other), KILN_ERROR_ARGUMENT);
  failures += expect("memory: truncated", kiln_model_load_memory(*data, bytes / 2, &other), KILN_ERROR_FILE);
  failures += expect("memory: no header", kiln_model_load_memory(*data, 40, &other), KILN_ERROR_FILE);
  failures += expect("memory: NULL model", kiln_model_load_memory(*data, bytes, NULL), KILN_ERROR_ARGUMENT);
  if (other) failures += expect("memory: a failed load leaves NULL", KILN_ERROR_ARGUMENT, KILN_OK);
  failures += expect("memory: load", kiln_model_load_memory(*data, bytes, model), KILN_OK);
  if (!*model) return failures + 1;
  const size_t need = kiln_model_workspace_size(*model);
  if (posix_memalign(workspace, 64, need + 64) != 0) exit(3);
  kiln_context *context = NULL;
  if (need) {
    failures += expect("workspace: NULL", kiln_context_create_in(*model, NULL, need, &context), KILN_ERROR_ARGUMENT);
    failures += expect("workspace: too small", kiln_context_create_in(*model, *workspace, need - 1, &context), KILN_ERROR_ARGUMENT);
    failures += expect("workspace: not aligned", kiln_context_create_in(*model, (char *)*workspace + 8, need, &context), KILN_ERROR_ARGUMENT);
  }
  failures += expect("workspace: no model", kiln_context_create_in(NULL, *workspace, need, &context), KILN_ERROR_ARGUMENT);
  if (context) failures += expect("workspace: a failed create leaves NULL", KILN_ERROR_ARGUMENT, KILN_OK);
  return failures;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strncmp(argv[1], "batch=", 6)) { /* capi_check batch=N MODE ...: -1 dims are N */
    batch = atoll(argv[1] + 6);
    ++argv, --argc;
  }
  if (argc > 1 && !strncmp(argv[1], "len=", 4)) { /* capi_check batch=N len=M MODE ...: -1 dims past axis 0 are M */
    length = atoll(argv[1] + 4);
    ++argv, --argc;
  }
  if (argc > 1 && !strncmp(argv[1], "shapes=", 7)) { /* capi_check shapes=1x3x17x23,1x2x9x12 run ...: each tensor's dims */
    const char *p = argv[1] + 7;
    while (*p && given_count < 64) {
      for (int d = 0; d < 8; ++d) {
        char *end = NULL;
        given[given_count][d] = strtoll(p, &end, 10);
        p = end;
        if (*p != 'x') break;
        ++p;
      }
      ++given_count;
      if (*p == ',') ++p;
      else break;
    }
    ++argv, --argc;
  }
  if (argc > 1 && !strncmp(argv[1], "ws=", 3)) { /* capi_check [batch=N] ws=M run ...: kiln_model_workspace_size_at(M) */
    workspace_length = atoll(argv[1] + 3);
    ++argv, --argc;
  }
  if (argc < 3) return 2;
  if (kiln_abi_version() != KILN_ABI_VERSION) return 4;
  kiln_model *model = NULL;
  void *memory = NULL, *workspace = NULL;
  const int in_memory = !strcmp(argv[1], "memory");
  if (in_memory && memory_misuse(argv[2], &model, &memory, &workspace)) return 1;
  const kiln_status loaded = in_memory ? KILN_OK : kiln_model_load(argv[2], &model);
  if (!strcmp(argv[1], "load")) {
    printf("load: status %d (%s)\n", (int)loaded, kiln_last_error());
    kiln_model_free(model);
    return 0;
  }
  if (loaded != KILN_OK) return fprintf(stderr, "%s\n", kiln_last_error()), 1;
  if (!strcmp(argv[1], "misuse")) {
    const int failures = misuse(model);
    kiln_model_free(model);
    return failures ? 1 : 0;
  }
  const int n_in = kiln_model_input_count(model), n_out = kiln_model_output_count(model);
  if (argc != 3 + n_in + n_out) return fprintf(stderr, "%d inputs and %d outputs\n", n_in, n_out), 2;
  DLTensor *inputs = calloc((size_t)n_in, sizeof(DLTensor)), *outputs = calloc((size_t)n_out, sizeof(DLTensor));
  for (int i = 0; i < n_in; ++i) {
    kiln_tensor_info info;
    kiln_model_input(model, i, &info);
    tensor(&inputs[i], &info, read_file(argv[3 + i], (size_t)count(&info) * (info.dtype.bits / 8)));
  }
  for (int i = 0; i < n_out; ++i) {
    kiln_tensor_info info;
    kiln_model_output(model, i, &info);
    tensor(&outputs[i], &info, malloc((size_t)count(&info) * (info.dtype.bits / 8)));
  }
  kiln_context *context = NULL;
  if (workspace_length > 0) { /* a workspace of the caller's sized for runs up to that length */
    const size_t bytes = kiln_model_workspace_size_at(model, workspace_length);
    if (posix_memalign(&workspace, 64, bytes + 64) != 0) return 3;
    if (kiln_context_create_in(model, workspace, bytes, &context) != KILN_OK) return fprintf(stderr, "%s\n", kiln_last_error()), 1;
  }
  const kiln_status created = context ? KILN_OK
                              : in_memory ? kiln_context_create_in(model, workspace, kiln_model_workspace_size(model), &context)
                                          : kiln_context_create(model, &context);
  if (created != KILN_OK || kiln_infer(context, inputs, n_in, outputs, n_out) != KILN_OK)
    return fprintf(stderr, "%s\n", kiln_last_error()), 1;
  for (int i = 0; i < n_out; ++i) {
    kiln_tensor_info info;
    kiln_model_output(model, i, &info);
    FILE *f = fopen(argv[3 + n_in + i], "wb");
    int64_t n = 1;
    for (int d = 0; d < outputs[i].ndim; ++d) n *= outputs[i].shape[d];
    const size_t bytes = (size_t)n * (info.dtype.bits / 8);
    if (!f || fwrite(outputs[i].data, 1, bytes, f) != bytes) return 3;
    fclose(f);
  }
  kiln_context_free(context);
  for (int i = 0; i < n_in; ++i) free(inputs[i].data);
  for (int i = 0; i < n_out; ++i) free(outputs[i].data);
  free(inputs), free(outputs);
  kiln_model_free(model);
  free(workspace), free(memory); /* (after the context and the model: they read them) */
  return 0;
}
