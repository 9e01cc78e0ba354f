#!/bin/bash
# Before s4.sh, in a call of its own (carry .carry/standin only: the binary is 37 MB as xz): unpacks the no-TC
# stand-in's llama-bench to /tmp/lcpp/standin-notc/bin and checks that it starts here (system libraries).
cd "$(dirname "$0")/../.."
mkdir -p /tmp/lcpp/standin-notc/bin
python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.carry/standin/llama-bench.xz'), \
open('/tmp/lcpp/standin-notc/bin/llama-bench', 'wb'))" && chmod +x /tmp/lcpp/standin-notc/bin/llama-bench
ls -la /tmp/lcpp/standin-notc/bin/llama-bench; ldd /tmp/lcpp/standin-notc/bin/llama-bench | grep "not found"
/tmp/lcpp/standin-notc/bin/llama-bench --help 2>&1 | head -3
