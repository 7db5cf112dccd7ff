"""Writing small llama GGUF files for tests (tests/ is on sys.path: `from ggufs import write_gguf`)."""

from waferrt.model.gguf_writer import Vocab, write_gguf

__all__ = ["Vocab", "write_gguf"]
