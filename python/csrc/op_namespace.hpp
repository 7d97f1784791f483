// The torch.ops namespace fattn's operators register in: fattn, or another one where a
// build defines FATTN_OP_NAMESPACE (ops.cpp's header says why), and its name as a string
// for looking an operator up by schema.
#pragma once

#ifndef FATTN_OP_NAMESPACE
#define FATTN_OP_NAMESPACE fattn
#endif
#define FATTN_STRINGIFY_(x) #x
#define FATTN_STRINGIFY(x) FATTN_STRINGIFY_(x)
