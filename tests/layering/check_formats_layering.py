#!/usr/bin/env python3
"""Checks that formats/'s sub-libraries include one way only.

Every folder formats/<part>/ is a library crashreplay_formats_<part>; the
allowed dependencies are the ones formats/CMakeLists.txt (and the CMake files
of the parts that have their own) link, PUBLIC or PRIVATE. A header belongs
to the part whose include/ folder holds it (crashreplay/formats/dtype.h is
numeric's: formats/numeric/include/crashreplay/formats/dtype.h); a quoted
include that is not beside the including file belongs to the part whose src/
holds it (io's json_util.h), and a generated crashreplay/schema/<name>.capnp.h
to the part whose schema/ holds <name>.capnp. A source or header of
formats/<part>/ may include a header of <other> only when <other> is <part> or
a library <part> links, directly or through others; and crashreplay/<top>/...
outside formats/ (base/ and nothing above it) only when crashreplay_<top> is
among them. Exit status 1 names every include that points the other way (and
any cycle in the links); 0 prints the order it checked.

usage: check_formats_layering.py [SOURCE_ROOT]
"""
import os
import re
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..', '..')
FORMATS = os.path.join(ROOT, 'formats')
PREFIX = 'crashreplay_formats_'
SOURCES = ('.cc', '.h', '.cu', '.cuh')


def read(path):
    with open(path, encoding='utf-8') as f:
        return f.read()


def strip_comments(text):
    return re.sub(r'#[^\n]*', '', text)


def link_graph():
    """part -> the crashreplay targets it links (as the CMake files say),
    and the targets the umbrella crashreplay_formats links."""
    deps, umbrella = {}, set()
    for dirpath, _, files in os.walk(FORMATS):
        if 'CMakeLists.txt' not in files:
            continue
        text = strip_comments(read(os.path.join(dirpath, 'CMakeLists.txt')))
        for m in re.finditer(r'crashreplay_formats_part\((\w+)([^)]*)\)', text):
            deps.setdefault(m.group(1), set()).update(re.findall(r'crashreplay_\w+', m.group(2)))
        for m in re.finditer(r'add_library\(' + PREFIX + r'(\w+)', text):
            deps.setdefault(m.group(1), set())
        for m in re.finditer(r'target_link_libraries\(' + PREFIX + r'(\w+)([^)]*)\)', text):
            deps.setdefault(m.group(1), set()).update(re.findall(r'crashreplay_\w+', m.group(2)))
        for m in re.finditer(r'target_link_libraries\(crashreplay_formats\s+INTERFACE([^)]*)\)', text):
            umbrella.update(re.findall(r'crashreplay_\w+', m.group(1)))
    return deps, umbrella


def name_of(target):
    return target[len(PREFIX):] if target.startswith(PREFIX) else target


def closure(deps, part):
    seen, todo = set(), [part]
    while todo:
        for t in deps.get(todo.pop(), ()):
            name = name_of(t)
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


def header_owners(parts):
    """include spelling -> part, for public headers, src/ headers and schemas."""
    public, private, problems = {}, {}, []
    for part in parts:
        base = os.path.join(FORMATS, part)
        for sub, table in (('include', public), ('src', private)):
            top = os.path.join(base, sub)
            for dirpath, _, files in os.walk(top):
                for name in files:
                    if not name.endswith(('.h', '.cuh')):
                        continue
                    spelling = os.path.relpath(os.path.join(dirpath, name), top).replace(os.sep, '/')
                    if spelling in table and table[spelling] != part:
                        problems.append(f'check_formats_layering: {spelling} is in both formats/'
                                        f'{table[spelling]}/{sub} and formats/{part}/{sub}')
                    table[spelling] = part
        schema = os.path.join(base, 'schema')
        if os.path.isdir(schema):
            for name in os.listdir(schema):
                if name.endswith('.capnp'):
                    public[f'crashreplay/schema/{name}.h'] = part
    return public, private, problems


def main():
    deps, umbrella = link_graph()
    parts = sorted(p for p in os.listdir(FORMATS) if os.path.isdir(os.path.join(FORMATS, p)))
    missing = [p for p in parts if p not in deps]
    if missing:
        print(f'check_formats_layering: formats/{missing[0]} is not a library in formats/ CMake files')
        return 1
    cycles = [p for p in parts if p in closure(deps, p)]
    if cycles:
        print('check_formats_layering: the links of ' + ', '.join(f'formats/{p}' for p in cycles) +
              ' go round in a cycle')
        return 1
    public, private, bad = header_owners(parts)
    include = re.compile(r'\s*#\s*include\s+([<"])([^">]+)[">]')
    for part in parts:
        allowed = closure(deps, part)
        for dirpath, _, files in os.walk(os.path.join(FORMATS, part)):
            for name in files:
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(dirpath, name)
                for lineno, line in enumerate(read(path).splitlines(), 1):
                    m = include.match(line)
                    if not m:
                        continue
                    quote, spelling = m.groups()
                    if quote == '"' and os.path.exists(os.path.join(dirpath, spelling)):
                        continue  # beside the including file: its own part
                    if spelling in public:
                        owner = public[spelling]
                    elif quote == '"' and spelling in private:
                        owner = private[spelling]
                    elif spelling.startswith('crashreplay/formats/'):
                        owner = None
                    elif spelling.startswith('crashreplay/'):
                        owner = 'crashreplay_' + spelling.split('/')[1]
                    else:
                        continue  # the standard library and third-party headers
                    rel = os.path.relpath(path, ROOT)
                    if owner is None:
                        bad.append(f'{rel}:{lineno}: formats/{part} includes {spelling}, '
                                   'which no formats/<part>/include holds')
                    elif owner != part and owner not in allowed:
                        what = owner if owner.startswith('crashreplay_') else f'formats/{owner}'
                        bad.append(f'{rel}:{lineno}: formats/{part} includes {spelling} of {what}, '
                                   f'but does not link it (it links: {", ".join(sorted(allowed)) or "nothing"})')
    for b in bad:
        print(b)
    if bad:
        return 1
    # The order: each part after the parts it links.
    order, placed = [], set()
    while len(order) < len(parts):
        ready = [p for p in parts if p not in placed and closure(deps, p) & set(parts) <= placed]
        order.extend(ready)
        placed.update(ready)
    print('check_formats_layering: formats/ includes one way, in the order ' +
          ', '.join(f'{p} (<- {", ".join(sorted(closure(deps, p) & set(parts))) or "base"})' for p in order) +
          '; crashreplay_formats is ' + ', '.join(sorted(name_of(t) for t in umbrella if t.startswith(PREFIX))))
    return 0


if __name__ == '__main__':
    sys.exit(main())
