#!/usr/bin/env python3
"""Checks that replay/'s sub-libraries include one way only.

The allowed dependencies are the ones replay/CMakeLists.txt (and
replay/cuda/CMakeLists.txt) link: a source or header of replay/<part>/ may
include crashreplay/replay/<other>/... only when <other> is <part> or a library
<part> links, directly or through others, and crashreplay/capture/... only when
capture is among them. Exit status 1 names every include that points the other
way; 0 prints the order it checked.

usage: check_layering.py [SOURCE_ROOT]
"""
import os
import re
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..', '..')
REPLAY = os.path.join(ROOT, 'replay')
PREFIX = 'crashreplay_replay_'


def read(path):
    with open(path, encoding='utf-8') as f:
        return f.read()


def link_graph():
    """part -> the crashreplay targets it links (as the CMake files say)."""
    deps = {}
    text = read(os.path.join(REPLAY, 'CMakeLists.txt'))
    for m in re.finditer(r'crashreplay_replay_part\((\w+)([^)]*)\)', text):
        deps[m.group(1)] = set(re.findall(r'crashreplay_\w+', m.group(2)))
    for m in re.finditer(r'target_link_libraries\((crashreplay_replay_\w+)\s+PUBLIC([^)]*)\)', text):
        deps.setdefault(m.group(1)[len(PREFIX):], set()).update(re.findall(r'crashreplay_\w+', m.group(2)))
    umbrella = re.search(r'target_link_libraries\(crashreplay_replay\s+INTERFACE([^)]*)\)', text)
    cuda = os.path.join(REPLAY, 'cuda', 'CMakeLists.txt')
    if os.path.exists(cuda):
        for m in re.finditer(r'target_link_libraries\(crashreplay_replay_cuda\s+PUBLIC([^)]*)\)', read(cuda)):
            deps.setdefault('cuda', set()).update(re.findall(r'crashreplay_\w+', m.group(1)))
    if umbrella:
        deps['_engine'] = set(re.findall(r'crashreplay_\w+', umbrella.group(1)))
    return deps


def closure(deps, part):
    seen, todo = set(), [part]
    while todo:
        p = todo.pop()
        for t in deps.get(p, ()):
            name = t[len(PREFIX):] if t.startswith(PREFIX) else ('_engine' if t == 'crashreplay_replay' else t)
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


def main():
    deps = link_graph()
    parts = sorted(p for p in os.listdir(REPLAY) if os.path.isdir(os.path.join(REPLAY, p)))
    missing = [p for p in parts if p not in deps]
    if missing:
        print(f'check_layering: replay/{missing[0]} is not a library in replay/CMakeLists.txt')
        return 1
    bad = []
    include = re.compile(r'#include\s+"crashreplay/(replay/(\w+)|capture)/')
    for part in parts:
        allowed = closure(deps, part)
        for dirpath, _, files in os.walk(os.path.join(REPLAY, part)):
            for name in files:
                if not name.endswith(('.cc', '.h', '.cu', '.cuh')):
                    continue
                path = os.path.join(dirpath, name)
                for lineno, line in enumerate(read(path).splitlines(), 1):
                    m = include.match(line)
                    if not m:
                        continue
                    other = m.group(2) if m.group(2) else 'crashreplay_capture'
                    if other != part and other not in allowed:
                        rel = os.path.relpath(path, ROOT)
                        bad.append(f'{rel}:{lineno}: replay/{part} includes {line.split()[1]}, '
                                   f'but does not link {other} (it links: {", ".join(sorted(allowed)) or "nothing"})')
    for b in bad:
        print(b)
    if bad:
        return 1
    engine = closure(deps, '_engine')
    if 'crashreplay_capture' in engine:
        print('check_layering: crashreplay_replay links crashreplay_capture')
        return 1
    print('check_layering: replay/ includes one way; the engine is ' +
          ', '.join(sorted(p for p in engine if p in parts)) + '; capture only in ' +
          ', '.join(p for p in parts if 'crashreplay_capture' in closure(deps, p)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
