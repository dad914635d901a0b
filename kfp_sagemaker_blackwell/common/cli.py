"""Command lines derived from one declaration: a function's signature and its docstring.

Every command line of this package (``python -m components.<name>``, ``python
pipelines/<name>.py``) takes its parameters from the KFP component's (or the
pipeline's) function: the flag is the parameter's name with dashes
(``model_preset`` -> ``--model-preset``), its default is the signature's, its
help text is the Google-style docstring's ``Args:`` entry, so a parameter has one
name, one default and one help text in the component, the pipeline and the CLI.

Values on the command line, by annotation:

- ``bool``: ``--x`` (true), ``--x true|false`` (also yes/no, on/off, 1/0), ``--no-x`` (false);
  a command's own switches take the same forms (:func:`add_switch`);
- ``str`` documented as ``auto (...), on, or off``: the same forms, ``--x`` and
  ``--x true`` meaning ``on``, ``--no-x`` and ``--x false`` ``off``, ``--x auto``;
- ``list``: JSON (``'["bf16","fp8"]'``) or comma-separated (``bf16,fp8``), repeatable
  and concatenated;
- ``dict``: JSON (``'{"lr": "3e-4"}'``) or ``KEY=VALUE``, repeatable and merged;
- ``str``, ``int``, ``float``: as written.

Flags are parsed with no default (``None`` = not given), so a command can tell
what was given from what was declared (:func:`given`); :func:`values` fills the
rest from the declaration.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kfp_sagemaker_blackwell.catalog import parameters as parameter_groups
from kfp_sagemaker_blackwell.catalog.parameters import Parameter, flag_name
from kfp_sagemaker_blackwell.catalog.paths import (  # noqa: F401 - the commands' path types
    input_file,
    input_file_or_stdin,
    output_dir,
    output_file,
)
from kfp_sagemaker_blackwell.common.errors import UserError

KINDS: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool, "list": list,
                          "dict": dict}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def key_values(flag: str, items: list[str] | None) -> dict[str, str]:
    """Repeated ``FLAG KEY=VALUE`` arguments as a dict; a malformed item is a UserError naming the flag."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(flag, f"{item!r} is not KEY=VALUE.", f"write {flag} KEY=VALUE.")
        out[key] = value
    return out


def doc_args(doc: str) -> dict[str, str]:
    """Google-style ``Args:`` entries of a docstring, name -> help on one line."""
    out: dict[str, str] = {}
    section = doc.split("Args:", 1)[1] if "Args:" in doc else ""
    section = re.split(r"\n\s*(?:Returns|Raises|Yields):", section)[0]
    indent = None
    current = ""
    for line in section.splitlines():
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        m = re.match(r"^\s*(\w+): ?(.*)$", line)
        if m and (indent is None or depth <= indent):
            indent = depth
            current = m.group(1)
            out[current] = m.group(2).strip()
        elif current:
            out[current] += " " + line.strip()
    return out


_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`<]*?)(?:\s*<[^>]*>)?`")


def plain(text: str, names: Iterable[str] = ()) -> str:
    """Docstring text as a terminal shows it: no reST markup.

    A role (``:func:`~a.b```) becomes its target (``b``; ``a.b`` without the
    tilde), a literal (````x````) its text, ``Examples::`` ``Examples:``; a
    parameter's name among ``names`` becomes its flag (````log_file```` ->
    ``--log-file``), the spelling the command line knows it by.
    """
    known = set(names)

    def literal(m: re.Match[str]) -> str:
        word = m.group(1)
        return flag_name(word) if word in known else word

    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    text = re.sub(r"``([^`]+)``", literal, text)
    return re.sub(r"(\w)::$", r"\1:", text, flags=re.M)


def _python_func(func: Any) -> Callable[..., Any]:
    """The plain function behind a KFP component or pipeline (``.python_func``), or ``func``."""
    return getattr(func, "python_func", func)


def _kind(func: Callable[..., Any], p: inspect.Parameter) -> type | None:
    """The value kind of a parameter, or None for a KFP artifact/path (not a command-line value)."""
    annotation = p.annotation
    if isinstance(annotation, str):
        try:
            annotation = typing.get_type_hints(func).get(p.name, annotation)
        except Exception:  # noqa: BLE001 - an unresolvable annotation is read by its name
            pass
    if isinstance(annotation, str):
        annotation = KINDS.get(annotation.removeprefix("Optional[").removesuffix("]"), annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kinds = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = kinds[0] if len(kinds) == 1 else annotation  # Optional[X] reads as X
    if annotation in KINDS.values():
        return annotation  # type: ignore[no-any-return]
    parts = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Annotated else ()
    modules = {getattr(a, "__module__", "") or type(a).__module__ for a in (annotation, *parts)}
    if any(m.startswith("kfp.") for m in modules):
        return None  # Input[...], Output[...], OutputPath(...): an artifact, not a flag
    raise TypeError(
        f"{func.__qualname__}({p.name}): annotation {annotation!r} has no command-line form; "
        f"use one of {', '.join(KINDS)}"
    )


def parameters(func: Any, *, exclude: Iterable[str] = ()) -> list[Parameter]:
    """The command-line parameters of a component, pipeline or function, in signature order.
    ``func`` may also be a ``"module:function"`` reference, read from its source without
    importing the module (:func:`source_parameters`): a command line that only needs the
    component's signature then starts without importing kfp (0.4 s)."""
    if isinstance(func, str):
        module, _, name = func.partition(":")
        return source_parameters(module, name, exclude=exclude)
    f = _python_func(func)
    signature = inspect.signature(f).parameters
    helps = {k: plain(v, signature) for k, v in doc_args(inspect.getdoc(f) or "").items()}
    skip = set(exclude)
    out = []
    for p in signature.values():
        if p.name in skip or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        kind = _kind(f, p)
        if kind is None:
            continue
        out.append(Parameter(p.name, kind, p.default, helps.get(p.name, "")))
    return out


def defaults(func: Any, *, exclude: Iterable[str] = ()) -> dict[str, Any]:
    """The declared defaults of ``func``'s command-line parameters (required ones left out)."""
    return {p.name: p.default for p in parameters(func, exclude=exclude) if not p.required}


def _source_function(module: str, function: str) -> Any:
    """``module.function``'s ``ast.FunctionDef``, read from the module's source file."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"no module {module}")
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read(), spec.origin)
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)


def source_parameters(module: str, function: str, *,
                      defaults: dict[str, Any] | None = None,
                      exclude: Iterable[str] = ()) -> list[Parameter]:
    """:func:`parameters` of ``module.function`` read from its source (``ast``), without
    importing the module: a KFP component's module cannot be imported inside the KFP
    executor (KFP's runtime leaves out the compile-time ``kfp.dsl``), where its body
    still needs its declaration. ``defaults``: name -> the value outside KFP of a default
    that is not a literal (a ``dsl.PIPELINE_*_PLACEHOLDER``); ``inspect.Parameter.empty``
    makes it required. ``exclude``: names left out (their defaults are not read)."""
    import ast

    node = _source_function(module, function)
    given = defaults or {}
    skip = set(exclude)
    args = node.args.args + node.args.kwonlyargs
    values = ([None] * (len(node.args.args) - len(node.args.defaults)) + node.args.defaults
              + node.args.kw_defaults)
    names = [a.arg for a in args]
    doc = parameter_groups.with_group_args(ast.get_docstring(node) or "", names)
    helps = {k: plain(v, names) for k, v in doc_args(doc).items()}
    out = []
    for arg, value in zip(args, values, strict=True):
        if arg.arg in skip:
            continue
        text = ast.unparse(arg.annotation) if arg.annotation else ""
        kind = KINDS.get(text.removeprefix("Optional[").removesuffix("]"))
        if kind is None:
            if re.match(r"^(Input|Output|InputPath|OutputPath)\b", text):
                continue  # a KFP artifact or path, not a value
            raise TypeError(f"{module}.{function}({arg.arg}): annotation {text!r} has no "
                            f"command-line form; use one of {', '.join(KINDS)}")
        if arg.arg in given:
            default = given[arg.arg]
        elif value is None:
            default = inspect.Parameter.empty
        else:
            try:
                default = ast.literal_eval(value)
            except ValueError:
                raise TypeError(f"{module}.{function}({arg.arg}): default "
                                f"{ast.unparse(value)} is not a literal; give its value "
                                "outside KFP in defaults") from None
        out.append(Parameter(arg.arg, kind, default, helps.get(arg.arg, "")))
    return out


def source_defaults(module: str, function: str) -> dict[str, Any]:
    """:func:`defaults` of ``module.function`` read from its source
    (:func:`source_parameters`): what a component's plain modules take as their
    defaults, so that they are written in the signature only."""
    return {p.name: p.default for p in source_parameters(module, function) if not p.required}


def dataclass_of(params: Iterable[Parameter], name: str, *, frozen: bool = False,
                 namespace: dict[str, Any] | None = None) -> type:
    """A keyword-only dataclass whose fields are ``params``: the same names, kinds and
    defaults, so that a configuration type is derived from a component's signature
    instead of copying it (a parameter added there is a field). A ``None`` or container
    default becomes a fresh container of the parameter's kind. ``namespace``: methods
    the dataclass itself needs (a ``__post_init__``)."""
    fields: list[tuple[str, type, Any]] = []
    for p in params:
        if p.required:
            fields.append((p.name, p.kind, dataclasses.field()))
        elif p.default is None or isinstance(p.default, list | dict):
            fields.append((p.name, p.kind, dataclasses.field(
                default_factory=functools.partial(p.kind, p.default or ()))))
        else:
            fields.append((p.name, p.kind, dataclasses.field(default=p.default)))
    return dataclasses.make_dataclass(name, fields, kw_only=True, frozen=frozen,
                                      namespace=namespace)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, whose usage error is one line (``prog: error: argument --flag:
    problem``; the options are in ``--help``) instead of a usage summary a screen long,
    still exit 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parse_bool(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parse_value(kind: type, text: str) -> Any:
    """One command-line word as a value of ``kind`` (see the module docstring)."""
    if kind is bool:
        return parse_bool(text)
    if kind is list:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            if text.lstrip().startswith(("[", "{", '"')):  # meant as JSON: never a comma split
                raise argparse.ArgumentTypeError(
                    f"{text!r} is not valid JSON ({exc.msg} at character {exc.pos}); write a "
                    "JSON list, e.g. '[\"bf16\",\"fp8\"]', or a,b,c without brackets") from None
            return [v.strip() for v in text.split(",") if v.strip()]
        if not isinstance(value, list):
            raise argparse.ArgumentTypeError(f"expected a JSON list or a,b,c, got {text!r}")
        return value
    if kind is dict:
        if text.lstrip().startswith("{"):
            try:
                value = json.loads(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}") from None
            if not isinstance(value, dict):
                raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
            return value
        key, sep, val = text.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE or a JSON object, got {text!r}")
        return {key: val}
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None


def show_default(value: Any) -> str:
    """A default as the help text shows it: JSON for lists/dicts, true/false; "" for none."""
    if value is inspect.Parameter.empty or value is None or value in ("", [], {}, ()):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict | tuple):
        return json.dumps(value)
    return str(value)


def is_on_off_auto(p: Parameter) -> bool:
    """A ``str`` parameter that is an on/off switch with an ``auto`` (its help says
    ``auto (...), on, or off``): on the command line it is written like a ``bool``."""
    return p.kind is str and bool(re.match(r"auto\b.*\bon,? (?:or )?off\b", p.help))


def parse_on_off_auto(text: str) -> str:
    """``on``/``off`` for a boolean word (true, yes, 1 ...), else the text (``auto``; a
    wrong word is the declaration's check to refuse, naming the parameter)."""
    lower = text.lower()
    return "on" if lower in _TRUE else "off" if lower in _FALSE else text


def add_switch(parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str,
               help: str) -> None:
    """A command's own on/off flag, written as every derived ``bool`` is: ``--x``,
    ``--x true|false``, ``--no-x``; its value lands in ``args.<x>`` (False by default)."""
    dest = flag[2:].replace("-", "_")
    parser.add_argument(flag, dest=dest, nargs="?", const=True, default=False, type=parse_bool,
                        metavar="BOOL", help=f"{help} (also --no-{flag[2:]})")
    parser.add_argument("--no-" + flag[2:], dest=dest, action="store_const", const=False,
                        help=argparse.SUPPRESS)


def add_report_outputs(parser: argparse.ArgumentParser, *, json_help: str) -> None:
    """What a command that reports on parse_logs' series takes besides its parameters: the
    series files, and where its reports go (compare_convergence, rank_throughput)."""
    parser.add_argument("series", nargs="+", type=input_file,
                        help="series CSV files written by parse_logs")
    parser.add_argument("--html", metavar="PATH", type=output_file,
                        help="write the HTML report here")
    parser.add_argument("--markdown", metavar="PATH", type=output_file,
                        help="write the Markdown summary here")
    parser.add_argument("--json", action="store_true", help=json_help)


class _MergeAction(argparse.Action):
    """A repeated list or dict flag: the values are concatenated (lists) or merged (dicts)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        before = getattr(namespace, self.dest, None)
        if isinstance(values, dict):
            setattr(namespace, self.dest, {**(before or {}), **values})
        else:
            setattr(namespace, self.dest, [*(before or []), *values])


def _with_default(text: str, shown: str, extra: str) -> str:
    parts = [text.strip()] if text.strip() else []
    notes = [f"default: {shown}"] if shown else []
    notes += [extra] if extra else []
    if notes:
        parts.append(f"({'; '.join(notes)})")
    return " ".join(parts)


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    params: Sequence[Parameter],
    *,
    required: bool = True,
    notes: dict[str, str] | None = None,
    aliases: dict[str, str] | None = None,
) -> None:
    """One flag per parameter; its value lands in ``args.<name>`` (None when not given).

    ``required``: parameters without a default are required flags (False when
    something else supplies them, e.g. the local backend for a pipeline's role).
    ``notes``: name -> text appended to the default in the help (e.g. another
    default that one mode uses). ``aliases``: old flag -> parameter name, accepted
    with a deprecation message on stderr.
    """
    notes = notes or {}
    old: dict[str, list[str]] = {}
    for flag, name in (aliases or {}).items():
        old.setdefault(name, []).append(flag)
    for p in params:
        note = notes.get(p.name, "")
        kwargs: dict[str, Any] = {"dest": p.name, "default": None}
        if p.kind is bool:
            negative = "--no-" + p.flag[2:]
            note = "; ".join(filter(None, [note, f"also {negative}"]))
            kwargs.update(nargs="?", const=True, type=parse_bool, metavar="BOOL")
            parser.add_argument(negative, dest=p.name, action="store_const", const=False,
                                default=None, help=argparse.SUPPRESS)
        elif is_on_off_auto(p):
            negative = "--no-" + p.flag[2:]
            note = "; ".join(filter(None, [note, f"{p.flag} alone: on; {negative}: off"]))
            kwargs.update(nargs="?", const="on", type=parse_on_off_auto, metavar="auto|on|off")
            parser.add_argument(negative, dest=p.name, action="store_const", const="off",
                                default=None, help=argparse.SUPPRESS)
        elif p.kind in (list, dict):
            kwargs.update(action=_MergeAction, type=_parser_for(p.kind),
                          metavar="KEY=VALUE|JSON" if p.kind is dict else "A,B|JSON")
        else:
            kwargs.update(type=_parser_for(p.kind), metavar=p.kind.__name__.upper())
        help_text = _with_default(p.help, show_default(p.default), note).replace("%", "%%")
        parser.add_argument(p.flag, **kwargs, help=help_text, required=required and p.required)
        for flag in old.get(p.name, []):
            action = deprecated(flag, p.flag, kwargs.get("action", argparse._StoreAction))
            parser.add_argument(flag, **{**kwargs, "action": action}, help=argparse.SUPPRESS)


def _parser_for(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return parse_value(kind, text)

    parse.__name__ = kind.__name__  # argparse names the type in its error message
    return parse


def deprecated(old: str, new: str, base: type[argparse.Action]) -> type[argparse.Action]:
    """``base`` that first says on stderr that ``old`` is now spelled ``new``."""

    class Deprecated(base):  # type: ignore[misc, valid-type]
        def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
            print(f"warning: {old} is deprecated; use {new}", file=sys.stderr)
            super().__call__(parser, namespace, values, option_string)

    return Deprecated


def given(args: argparse.Namespace, params: Iterable[Parameter]) -> dict[str, Any]:
    """The parameters given on the command line, name -> value."""
    return {p.name: getattr(args, p.name) for p in params if getattr(args, p.name, None) is not None}


def values(args: argparse.Namespace, params: Iterable[Parameter]) -> dict[str, Any]:
    """Every parameter's value: as given, else its declared default (required ones as given)."""
    params = list(params)
    out = {p.name: p.default for p in params if not p.required}
    out.update(given(args, params))
    return out


def parse(
    built: tuple[argparse.ArgumentParser, list[Parameter]], argv: list[str] | None
) -> tuple[argparse.Namespace, dict[str, Any]]:
    """``argv`` parsed by a :func:`derived_parser`: the namespace and every parameter's value."""
    parser, params = built
    args = parser.parse_args(argv)
    return args, values(args, params)


def derived_parser(
    func: Any,
    *,
    prog: str | None = None,
    doc: str | None = None,
    exclude: Iterable[str] = (),
    title: str | None = None,
    **add: Any,
) -> tuple[argparse.ArgumentParser, list[Parameter]]:
    """An ArgumentParser whose flags are ``func``'s parameters (see :func:`add_flags`).
    ``func``: a component or function, or a ``"module:function"`` reference (read from source,
    see :func:`parameters`).

    ``prog``: default ``python -m <its package>`` for a component (``components/<name>/
    component.py``'s, run as ``python -m kfp_sagemaker_blackwell.components.<name>``).
    ``doc``: the description (default: ``func``'s docstring up to its ``Args:``);
    its part after ``Examples::`` becomes the epilog. ``title``: a group heading
    for the parameters.
    """
    if isinstance(func, str):  # "module:function", read from its source (see parameters)
        import ast

        module, _, name = func.partition(":")
        node = _source_function(module, name)
        docstring = ast.get_docstring(node) or ""
        names: Iterable[str] = [a.arg for a in node.args.args + node.args.kwonlyargs]
    else:
        module = _python_func(func).__module__
        docstring = inspect.getdoc(_python_func(func)) or ""
        names = inspect.signature(_python_func(func)).parameters
    if prog is None:
        prog = "python -m " + module.removesuffix(".component")
    if doc is None:
        doc = re.split(r"\n\s*Args:", docstring)[0]
    description, _, examples = doc.strip().partition("Examples::")
    description, examples = plain(description, names), plain(examples, names)
    parser = ArgumentParser(
        prog=prog,
        description=description.strip(),
        epilog=("Examples:\n" + examples.strip("\n")) if examples else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    params = parameters(func, exclude=exclude)
    add_flags(parser.add_argument_group(title) if title else parser, params, **add)
    return parser, params


def declared(func: Any, given: Mapping[str, Any] | None = None, /, **more: Any) -> dict[str, Any]:
    """Every command-line parameter of ``func`` by name: as given, else its declared default.

    What a caller other than the component or its CLI (a test, another command) hands a
    component's domain code, so that a default is written in the signature only. Artifact
    parameters are not among them. A name ``func`` does not declare, or a required
    parameter not given, is a TypeError, as a wrong keyword argument is.
    """
    chosen = {**(given or {}), **more}
    params = parameters(func)
    unknown = sorted(set(chosen) - {p.name for p in params})
    missing = [p.name for p in params if p.required and p.name not in chosen]
    if unknown or missing:
        where = func if isinstance(func, str) else _python_func(func).__qualname__
        raise TypeError(f"{where}: unknown parameters {unknown}, "
                        f"missing required {missing}")
    out = {p.name: copy.deepcopy(p.default) for p in params if not p.required}
    out.update(chosen)
    return out
