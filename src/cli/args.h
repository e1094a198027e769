/* args.h — tiny option parsing for subcommands: `--name value` and `--flag`. */
#ifndef MS_ARGS_H
#define MS_ARGS_H

#include <stdint.h>

/* Returns the value after `--name` in argv (NULL if absent). Marks both as used. */
const char *ms_arg_str(int argc, char **argv, const char *name);
/* 1 if `--name` is present (marks it used). */
int ms_arg_flag(int argc, char **argv, const char *name);
/* Integer option with bounds; prints an error and returns -1 on bad value, 0 ok. */
int ms_arg_int(int argc, char **argv, const char *name, int64_t lo, int64_t hi, int64_t *out);
/* The i-th positional argument (not an option or option value), or NULL. */
const char *ms_arg_pos(int argc, char **argv, int i);
/* Print an error for any option not consumed so far; returns 1 if one was found. */
int ms_args_unknown(int argc, char **argv, const char *cmd);

#endif
