/* fusebox plugin ABI, version 1.0. One exported symbol:
 *
 *     const FbPluginVTable *fusebox_plugin_entry_v1(void);
 *
 * The host reads abi_major, abi_minor and struct_size first and refuses the plugin unless
 * abi_major == FUSEBOX_PLUGIN_ABI_MAJOR and struct_size >= sizeof(FbPluginVTable) (minor
 * versions only append fields). Every callback returns FB_OK, FB_ERROR or FB_PANIC; on FB_ERROR
 * and FB_PANIC it may set *err to a NUL-terminated message the host releases with free_string.
 * No callback may unwind into the host. Ownership never crosses the boundary except through the
 * free_* callbacks: the host never frees plugin memory itself, and vice versa.
 *
 * NULL: no field of FbPluginVTable may be NULL in ABI 1.0. name, version and patterns_toml must
 * point at NUL-terminated UTF-8 (patterns_toml may be the empty string: no patterns), and all
 * eight callbacks (create, claim, compile, run, free_tensor, free_artifact, free_instance,
 * free_string) are required. The host checks every one when it loads the plugin and refuses a
 * table with a NULL entry, naming the library and the field; it never calls through NULL.
 * Out-parameters: a callback may leave *err and *reason NULL (no message).
 *
 * Functions cross as text IR: a module (TVMScript-style Relax text printed by fusebox) holding
 * the function named func_name and every function it calls. Tensors cross as FbTensor. */
#ifndef FUSEBOX_PLUGIN_H
#define FUSEBOX_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#define FUSEBOX_PLUGIN_ABI_MAJOR 1
#define FUSEBOX_PLUGIN_ABI_MINOR 0

enum { FB_OK = 0, FB_ERROR = 1, FB_PANIC = 2 };

typedef enum FbDType {
  FB_F16 = 0, FB_BF16 = 1, FB_F32 = 2, FB_F64 = 3, FB_I8 = 4, FB_U8 = 5, FB_I32 = 6,
  FB_I64 = 7, FB_BOOL = 8
} FbDType;

typedef enum FbDevice { FB_DEVICE_CPU = 0, FB_DEVICE_CUDA = 1 } FbDevice;

/* A strided tensor; strides are in elements. data may be NULL when a dim is 0. */
typedef struct FbTensor {
  void *data;
  int32_t dtype;  /* FbDType */
  int32_t ndim;
  const int64_t *shape;
  const int64_t *strides;
  int32_t device; /* FbDevice */
  int32_t device_id;
} FbTensor;

typedef struct FbPluginVTable {
  uint32_t abi_major;
  uint32_t abi_minor;
  uint64_t struct_size; /* sizeof(FbPluginVTable) as the plugin was built */
  const char *name;     /* the backend name, unique among backends */
  const char *version;
  const char *patterns_toml; /* [[pattern]] tables, as in fusebox pattern tables */
  /* Callbacks: all required (non-NULL). */
  /* Makes a backend instance from its [backend.options] table printed as TOML. */
  int32_t (*create)(const char *options_toml, void **instance, char **err);
  /* *accept = 1 to claim, 0 to decline with *reason set (released with free_string). */
  int32_t (*claim)(void *instance, const char *module_text, const char *func_name,
                   int32_t *accept, char **reason, char **err);
  int32_t (*compile)(void *instance, const char *module_text, const char *func_name,
                     void **artifact, char **err);
  /* Runs an artifact; *out is filled by the plugin and released with free_tensor. */
  int32_t (*run)(void *artifact, const FbTensor *args, size_t nargs, FbTensor *out, char **err);
  void (*free_tensor)(FbTensor *t);
  void (*free_artifact)(void *artifact);
  void (*free_instance)(void *instance);
  void (*free_string)(char *s);
} FbPluginVTable;

const FbPluginVTable *fusebox_plugin_entry_v1(void);

#endif
