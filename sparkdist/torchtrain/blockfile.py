"""Writing a spilled partition's rows (:mod:`sparkdist.torchtrain.feed`) to an Arrow IPC file
in blocks of a fixed number of rows: the unit the feed shuffles and reads back."""

from __future__ import annotations

import contextlib

import pyarrow as pa


class BlockWriter:
    """Writes rows to an Arrow IPC file in record batches of exactly ``block_rows`` rows."""

    def __init__(self, path: str, block_rows: int) -> None:
        self._path = path
        self._block_rows = block_rows
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._writer: pa.ipc.RecordBatchFileWriter | None = None

    def write(self, rows: pa.RecordBatch) -> None:
        """Queue rows; write every full block (the queue stays under one block)."""
        if rows.num_rows == 0:
            return
        self._pending.append(rows)
        self._pending_rows += rows.num_rows
        if self._pending_rows >= self._block_rows:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        table = pa.Table.from_batches(self._pending).combine_chunks()
        full = table.num_rows if final else table.num_rows - table.num_rows % self._block_rows
        for start in range(0, full, self._block_rows):
            self._emit(table.slice(start, min(self._block_rows, full - start)))
        rest = table.slice(full)
        self._pending = rest.to_batches() if rest.num_rows else []
        self._pending_rows = rest.num_rows

    def _emit(self, block: pa.Table) -> None:
        if self._writer is None:
            self._writer = pa.ipc.new_file(self._path, block.schema)
        self._writer.write_table(block, max_chunksize=self._block_rows)

    def close(self, schema: pa.Schema) -> None:
        """Write the last, shorter block; an empty file still gets the schema."""
        if self._pending_rows:
            self._flush(final=True)
        if self._writer is None:
            self._writer = pa.ipc.new_file(self._path, schema)
        self._writer.close()

    def abort(self) -> None:
        """Release the file after a failure; the half-written file is left for the caller."""
        if self._writer is not None:
            with contextlib.suppress(Exception):  # the original error is the one to report
                self._writer.close()
