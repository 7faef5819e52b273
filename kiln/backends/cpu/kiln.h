/* kiln.h: run a model kiln compiled (`kiln compile MODEL --emit c -o DIR`) from C or C++, without
   Python, NumPy or a compiler on the machine: only libc, libm and pthreads.

   What the header promises (ABI version KILN_ABI_VERSION):
   - A kiln_model is immutable once loaded: share it across threads. A kiln_context holds one
     run's working memory: one thread at a time per context (make one per thread).
   - kiln_infer allocates nothing: the context's memory was made by kiln_context_create.
   - Every error is a status code (never an abort or a signal) with a message in
     kiln_last_error() (per thread, valid until that thread's next kiln call).
   - Tensors are DLPack DLTensors on the CPU, C-contiguous, of the dtype and dims
     kiln_model_input/kiln_model_output describe: NumPy, PyTorch and other runtimes hand theirs
     over without copies. Inputs are read, outputs written; the caller owns both.
   - The weights file is checked when it is loaded (its header, its size, its checksum, the model
     and the instruction set it was built for): a damaged, truncated or foreign file is refused. */
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_ABI_VERSION 2

/* DLPack's tensor (https://github.com/dmlc/dlpack, v0.8 layout); skipped when dlpack.h came first */
#ifndef DLPACK_VERSION
typedef enum { kDLCPU = 1 } DLDeviceType;
typedef struct {
  int32_t device_type; /* DLDeviceType: kDLCPU */
  int32_t device_id;
} DLDevice;
typedef enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 } DLDataTypeCode;
typedef struct {
  uint8_t code; /* DLDataTypeCode */
  uint8_t bits;
  uint16_t lanes;
} DLDataType;
typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides; /* NULL: C-contiguous (the only layout kiln takes) */
  uint64_t byte_offset;
} DLTensor;
#endif

typedef enum {
  KILN_OK = 0,
  KILN_ERROR_ARGUMENT = 1, /* a NULL pointer, an index out of range, a wrong tensor count */
  KILN_ERROR_FILE = 2,     /* the weights file: missing, unreadable, damaged, another model's or kiln's */
  KILN_ERROR_CPU = 3,      /* built for instructions this CPU lacks */
  KILN_ERROR_TENSOR = 4,   /* a tensor's device, dtype, dims or layout is not the model's */
  KILN_ERROR_MEMORY = 5,   /* out of memory */
  KILN_ERROR_RUN = 6       /* the model refused its inputs while running (an index out of range) */
} kiln_status;

typedef struct kiln_model kiln_model;
typedef struct kiln_context kiln_context;

typedef struct {
  const char *name;
  DLDataType dtype;
  int32_t ndim;
  const int64_t *shape; /* ndim dims (-1: a dim given at run time, within [min_shape, max_shape]) */
  const int64_t *min_shape;
  const int64_t *max_shape;
} kiln_tensor_info;

/* KILN_ABI_VERSION of the library (check it equals the header's) */
int kiln_abi_version(void);
/* load the model's weights file (the library holds its code); *model is NULL on failure */
kiln_status kiln_model_load(const char *weights_path, kiln_model **model);
/* the model from its weights file's bytes already in memory (embedded in a program, read from an
   archive): checked as a file is, then used in place, never copied, so they must be 64-byte aligned
   and stay valid and unchanged until kiln_model_free */
kiln_status kiln_model_load_memory(const void *data, size_t bytes, kiln_model **model);
void kiln_model_free(kiln_model *model);
int kiln_model_input_count(const kiln_model *model);
int kiln_model_output_count(const kiln_model *model);
kiln_status kiln_model_input(const kiln_model *model, int index, kiln_tensor_info *info);
kiln_status kiln_model_output(const kiln_model *model, int index, kiln_tensor_info *info);
/* output `index`'s dims for these inputs (a -1 dim follows them: the batch, the length, or a size
   the model computes from the inputs' dims) into `shape` (its ndim values); the inputs' data is not
   read, only their dims, which are checked as kiln_infer checks them */
kiln_status kiln_model_output_shape(const kiln_model *model, const DLTensor *inputs, int input_count, int index, int64_t *shape);
/* bytes of working memory a context of this model holds (every size of its range runs in it) */
size_t kiln_model_workspace_size(const kiln_model *model);
/* bytes a context needs to run at most `length` of a run-time length (a workspace this size given to
   kiln_context_create_in runs every length up to it; a longer run returns KILN_ERROR_ARGUMENT);
   kiln_model_workspace_size for a model without one */
size_t kiln_model_workspace_size_at(const kiln_model *model, int64_t length);
/* a context for one thread at a time; *context is NULL on failure */
kiln_status kiln_context_create(const kiln_model *model, kiln_context **context);
/* a context on a workspace the caller owns: at least kiln_model_workspace_size bytes (a run-time
   length: kiln_model_workspace_size_at the longest run), 64-byte aligned, zeroed here, and left
   alone by kiln_context_free (it must outlive the context) */
kiln_status kiln_context_create_in(const kiln_model *model, void *workspace, size_t bytes, kiln_context **context);
void kiln_context_free(kiln_context *context);
/* one inference: inputs and outputs in the order kiln_model_input/output list them */
kiln_status kiln_infer(kiln_context *context, const DLTensor *inputs, int input_count, DLTensor *outputs, int output_count);
/* threads of the process-wide pool the models' loops run on (0: every CPU the process may use) */
void kiln_set_thread_count(int threads);
/* the calling thread's last error message ("" after a success) */
const char *kiln_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
