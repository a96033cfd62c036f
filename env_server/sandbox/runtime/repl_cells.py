"""A Python cell's compile and its error: the code split into its statements and a last expression (whose value
the reply carries), the source registered for tracebacks, and a traceback that shows the user's frames only."""

import ast
import linecache
import traceback


def cap_text(text, cap):
    """(`text` cut to `cap` characters with a marker, whether it was cut); None stays None."""
    if text is None:
        return None, False
    text = text.encode("utf-8", "replace").decode("utf-8")  # drop lone surrogates
    if len(text) <= cap:
        return text, False
    return text[:cap] + "\n... [truncated %d characters]" % (len(text) - cap), True


def compile_cell(code, number):
    """(the cell's statements, its last expression or None), compiled as `<cell-number>`."""
    filename = "<cell-%d>" % number
    # Register the source so tracebacks show the offending lines.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, filename, "exec")
    expr = compile(last, filename, "eval") if last is not None else None
    return body, expr


def format_error(exc, hidden_files):
    """The traceback of `exc` from the user's first cell frame on, without the frames of `hidden_files` (the
    signal handlers that raised an interrupt inside the user's code)."""
    tb = exc.__traceback__
    # Hide the REPL's own frames: start at the user's cell...
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell-"):
        tb = tb.tb_next
    if isinstance(exc, SyntaxError):
        tb = None
    te = traceback.TracebackException(type(exc), exc, tb)
    # ...and drop the signal handlers' frames that raised the interrupt inside it.
    seen = set()
    node = te
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        node.stack = traceback.StackSummary.from_list([f for f in node.stack if f.filename not in hidden_files])
        node = node.__cause__ or node.__context__
    return "".join(te.format())
