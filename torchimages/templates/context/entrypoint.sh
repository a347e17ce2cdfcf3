#!/bin/sh
# Warn early about Docker's 64 MB /dev/shm default: DataLoader workers die with "Bus error" later.
min_kb=1048576
shm_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR==2 {print $2}')
if [ -n "$shm_kb" ] && [ "$shm_kb" -lt "$min_kb" ]; then
    echo "torchimages: /dev/shm is $((shm_kb / 1024)) MB; DataLoader workers need more." \
         "Run with --shm-size=8g or --ipc=host." >&2
fi
exec "$@"
