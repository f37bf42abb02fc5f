"""How every command line refuses a user's input: exit 2, nothing on stdout, one ``error:`` line on stderr."""

def one_error_line(code: int, out: str, err: str, *fragments: str) -> str:
    """Asserts the refusal and that its line holds each fragment; returns the line. With capsys:
    ``one_error_line(main(argv), *capsys.readouterr(), "fragment")``."""
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error: "), (code, out, err)
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]
