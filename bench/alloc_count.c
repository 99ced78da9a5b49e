// Counts a process's malloc-family calls (LD_PRELOAD) and writes the count
// to $ALLOC_COUNT_FILE every 50 ms: bench/allocations.py reads it.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static atomic_ulong count;
static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static int (*real_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static char buf[65536]; static size_t used;
static void *early(size_t n){ n=(n+15)&~15; void*p=buf+used; used+=n; return p; }
void *malloc(size_t n){ if(!real_malloc){ real_malloc=dlsym(RTLD_NEXT,"malloc"); if(!real_malloc) return early(n);} atomic_fetch_add_explicit(&count,1,memory_order_relaxed); return real_malloc(n); }
void *calloc(size_t a,size_t b){ if(!real_calloc){ static int in; if(in){ void*p=early(a*b); return p;} in=1; real_calloc=dlsym(RTLD_NEXT,"calloc"); in=0; if(!real_calloc) return early(a*b);} atomic_fetch_add_explicit(&count,1,memory_order_relaxed); return real_calloc(a,b); }
void *realloc(void*p,size_t n){ if(!real_realloc) real_realloc=dlsym(RTLD_NEXT,"realloc"); atomic_fetch_add_explicit(&count,1,memory_order_relaxed); return real_realloc(p,n); }
int posix_memalign(void**p,size_t a,size_t n){ if(!real_memalign) real_memalign=dlsym(RTLD_NEXT,"posix_memalign"); atomic_fetch_add_explicit(&count,1,memory_order_relaxed); return real_memalign(p,a,n); }
void *aligned_alloc(size_t a,size_t n){ if(!real_aligned_alloc) real_aligned_alloc=dlsym(RTLD_NEXT,"aligned_alloc"); atomic_fetch_add_explicit(&count,1,memory_order_relaxed); return real_aligned_alloc(a,n); }
void free(void*p){ static void (*real_free)(void*); if((char*)p>=buf && (char*)p<buf+sizeof buf) return; if(!real_free) real_free=dlsym(RTLD_NEXT,"free"); real_free(p); }
static void *writer(void*a){ const char*f=getenv("ALLOC_COUNT_FILE"); if(!f) return 0; for(;;){ FILE*o=fopen(f,"w"); if(o){ fprintf(o,"%lu\n",atomic_load(&count)); fclose(o);} usleep(50000);} }
__attribute__((constructor)) static void start(void){ pthread_t t; pthread_create(&t,0,writer,0); pthread_detach(t); }
