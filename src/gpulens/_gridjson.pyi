def scan(array: bytes, step_ms: int, /) -> tuple[int, list[int] | None, bytes, int, list[int]] | None: ...
def items(
    first_ms: int,
    step_ms: int,
    blob: bytes,
    n: int,
    offsets: list[int] | None,
    lo_ms: int,
    hi_ms: int,
    /,
) -> bytes | None: ...
