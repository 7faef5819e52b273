/* kiln's C API in one screen: load the model, describe it, run it once on zeros, print the outputs.
   cc -std=c99 -O2 main.c -I. -L. -lkiln_model -Wl,-rpath,'$ORIGIN' -o example && ./example model.kw */
#include <stdio.h>
#include <stdlib.h>

#include "kiln.h"

static int64_t dims[256][8]; /* each tensor's dims: a -1 (a range) at its smallest size */
static int used = 0;

static int64_t elements(const kiln_tensor_info *info, int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < info->ndim; ++d) n *= shape[d] = info->shape[d] < 0 ? info->min_shape[d] : info->shape[d];
  return n;
}

/* an input at its smallest sizes; an output at the dims those inputs give it */
static int fill(const kiln_model *model, int index, const DLTensor *inputs, DLTensor *tensor) {
  kiln_tensor_info info;
  const int output = inputs != NULL;
  if ((output ? kiln_model_output(model, index, &info) : kiln_model_input(model, index, &info)) != KILN_OK) return 0;
  if (used >= 256 || info.ndim > 8) return 0;
  int64_t *shape = dims[used++], n = elements(&info, shape);
  if (output) {
    if (kiln_model_output_shape(model, inputs, kiln_model_input_count(model), index, shape) != KILN_OK) return 0;
    n = 1;
    for (int d = 0; d < info.ndim; ++d) n *= shape[d];
  }
  tensor->data = calloc((size_t)n + 1, info.dtype.bits / 8);
  tensor->device.device_type = kDLCPU;
  tensor->device.device_id = 0;
  tensor->ndim = info.ndim;
  tensor->dtype = info.dtype;
  tensor->shape = shape;
  tensor->strides = NULL;
  tensor->byte_offset = 0;
  printf("%s %d: %s, %d dims\n", output ? "output" : "input", index, info.name, (int)info.ndim);
  return tensor->data != NULL;
}

int main(int argc, char **argv) {
  if (kiln_abi_version() != KILN_ABI_VERSION) return fprintf(stderr, "kiln.h and the library differ\n"), 2;
  kiln_model *model = NULL;
  if (kiln_model_load(argc > 1 ? argv[1] : "model.kw", &model) != KILN_OK) return fprintf(stderr, "%s\n", kiln_last_error()), 1;
  const int n_in = kiln_model_input_count(model), n_out = kiln_model_output_count(model);
  DLTensor *inputs = calloc((size_t)n_in + 1, sizeof(DLTensor)), *outputs = calloc((size_t)n_out + 1, sizeof(DLTensor));
  for (int i = 0; i < n_in; ++i)
    if (!fill(model, i, NULL, &inputs[i])) return fprintf(stderr, "%s\n", kiln_last_error()), 1;
  for (int i = 0; i < n_out; ++i)
    if (!fill(model, i, inputs, &outputs[i])) return fprintf(stderr, "%s\n", kiln_last_error()), 1;
  kiln_context *context = NULL;
  if (kiln_context_create(model, &context) != KILN_OK || kiln_infer(context, inputs, n_in, outputs, n_out) != KILN_OK)
    return fprintf(stderr, "%s\n", kiln_last_error()), 1;
  for (int i = 0; i < n_out; ++i)
    if (outputs[i].dtype.code == kDLFloat && outputs[i].dtype.bits == 32)
      printf("output %d starts %g\n", i, (double)((const float *)outputs[i].data)[0]);
  kiln_context_free(context);
  for (int i = 0; i < n_in; ++i) free(inputs[i].data);
  for (int i = 0; i < n_out; ++i) free(outputs[i].data);
  free(inputs), free(outputs);
  kiln_model_free(model);
  return 0;
}
