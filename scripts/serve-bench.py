#!/usr/bin/env python3
"""Generated tokens per second of `petrel serve` over HTTP with C streaming clients at once.

Starts the server on a free port, then for each concurrency C runs one warm-up round and --runs
timed rounds of C streaming completions (/v1/completions: no chat template needed, so random
weights with any tokenizer serve too), each generating exactly --tokens tokens (the end
tokens banned through logit_bias), and prints the median (min-max) of all streams' tokens over the
round's wall time. Every stream is checked: it must end with [DONE], report --tokens completion
tokens in its usage chunk and carry a response id no other stream has; a lost, cut or duplicated
stream fails the run. Python's standard library only, so it runs wherever the server does.

  scripts/serve-bench.py [--petrel build/src/petrel] [--model models/petrel-tiny]
                         [--concurrency 1,8,32] [--tokens 128] [--runs 5] [--ban 2]
                         [-- SERVER FLAGS...]
  (--model '' serves what the server flags say, e.g. -- --synthetic qwen3.5-35b-a3b --tokenizer DIR)
"""
import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import threading
import time


def parse_args():
    argv = sys.argv[1:]
    server_flags = []
    if '--' in argv:
        server_flags = argv[argv.index('--') + 1:]
        argv = argv[:argv.index('--')]
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--petrel', default='build/src/petrel')
    p.add_argument('--model', default='models/petrel-tiny', help="checkpoint folder ('' : none)")
    p.add_argument('--concurrency', default='1,8,32')
    p.add_argument('--tokens', type=int, default=128)
    p.add_argument('--runs', type=int, default=5)
    p.add_argument('--ban', default='2', help='token ids banned so that every answer runs to --tokens')
    o = p.parse_args(argv)
    o.concurrency = [int(c) for c in o.concurrency.split(',')]
    o.ban = [int(b) for b in o.ban.split(',') if b]
    o.server_flags = server_flags
    return o


def start_server(o):
    args = [o.petrel, 'serve'] + ([o.model] if o.model else [])
    args += ['--port', '0', '--max-sequences', str(max(o.concurrency)), '--no-request-log'] + o.server_flags
    child = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = ''
    port = None
    while port is None:
        line = child.stderr.readline()
        if not line:
            raise RuntimeError(f'petrel serve exited ({child.wait()}):\n{log}')
        log += line
        m = re.search(r'listening on http://[\d.]+:(\d+)', line)
        if m:
            port = int(m.group(1))
    # Keep draining stderr so that the server never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in child.stderr], daemon=True).start()
    while True:
        try:
            c = http.client.HTTPConnection('127.0.0.1', port, timeout=5)
            c.request('GET', '/health')
            if c.getresponse().status == 200:
                return child, port
        except OSError:
            pass
        if child.poll() is not None:
            raise RuntimeError(f'petrel serve exited ({child.returncode})')
        time.sleep(0.2)


def stream(port, question, o):
    """One streaming request; returns (response id, completion tokens) or raises."""
    body = {'prompt': question, 'max_tokens': o.tokens, 'temperature': 0,
            'stream': True, 'stream_options': {'include_usage': True},
            'logit_bias': {str(b): -100 for b in o.ban}}
    c = http.client.HTTPConnection('127.0.0.1', port, timeout=600)
    c.request('POST', '/v1/completions', json.dumps(body), {'Content-Type': 'application/json'})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f'status {r.status}: {r.read()[:300]!r}')
    ids, usage, done = set(), None, False
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith('data:'):
            continue
        data = line[5:].strip()
        if data == '[DONE]':
            done = True
            break
        chunk = json.loads(data)
        ids.add(chunk['id'])
        if chunk.get('usage'):
            usage = chunk['usage']
    if not done or usage is None or len(ids) != 1:
        raise RuntimeError(f'stream cut short: done={done} usage={usage} ids={ids}')
    if usage['completion_tokens'] != o.tokens:
        raise RuntimeError(f"{usage['completion_tokens']} tokens instead of {o.tokens}")
    return ids.pop(), usage['completion_tokens']


def run_round(port, concurrency, o):
    results, errors = [None] * concurrency, []

    def client(i):
        try:
            results[i] = stream(port, f'What is {100 + i} + {7 * i}?', o)
        except Exception as e:  # every failure is reported, none is dropped
            errors.append(f'client {i}: {e}')

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    if errors:
        raise RuntimeError('; '.join(errors[:5]) + f' ({len(errors)} of {concurrency} failed)')
    ids = [r[0] for r in results]
    if len(set(ids)) != len(ids):
        raise RuntimeError('two streams carried the same response id')
    return sum(r[1] for r in results) / seconds


def main():
    o = parse_args()
    child, port = start_server(o)
    try:
        print(f'| concurrency | generated tokens/s, median (min-max) of {o.runs} | tokens per request |')
        print('| --- | --- | --- |')
        for c in o.concurrency:
            run_round(port, c, o)
            rates = sorted(run_round(port, c, o) for _ in range(o.runs))
            print(f'| {c} | {statistics.median(rates):.0f} ({rates[0]:.0f}-{rates[-1]:.0f}) | {o.tokens} |', flush=True)
    finally:
        child.terminate()
        child.wait()


if __name__ == '__main__':
    main()
