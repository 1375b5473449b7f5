"""Checkers for the exercises at the end of each chapter.

Each checker takes what the reader wrote (a function, a spec, a number), tries it on fresh inputs
and compares it with a reference the way a reviewer would: values, shardings and, where the
exercise is about communication, the compiled program. It answers with a ``Verdict``: one
friendly sentence saying what is right or what is wrong. It never raises, whatever the reader's
code does. Chapters call them as ``book.exercises.ch05_ring_sum(...)``; the checkers live in one
module per part of the book.
"""

from book.exercises.arrays import (
    ch01_chip_rows,
    ch01_reversed_mesh,
    ch02_predict,
    ch02_rows_on_device_1,
    ch02_spec_for_64_bytes,
    ch03_gram,
    ch03_no_communication,
    ch03_sum_groups,
    ch04_mlp,
    ch04_predict_types,
    ch04_small_operand,
)
from book.exercises.core import Verdict
from book.exercises.experts import (
    ch15_all_to_all_bytes,
    ch15_capacity,
    ch15_merge_normalized,
)
from book.exercises.hosts import (
    INTENSITY_SHAPES,
    ch11_column_means,
    ch11_own_rows,
    ch12_dp_tp_bytes,
    ch12_intensity,
    ch12_timer,
    matmul_intensity,
)
from book.exercises.manual import (
    ch05_from_five,
    ch05_predict_all_to_all,
    ch05_ring_sum,
    ch06_both_ways,
    ch06_ring_right,
)
from book.exercises.newer import ch21_stash_bytes, ch21_ulysses_wins
from book.exercises.pipeline import ch14_in_flight, ch14_microbatches, ch14_stage_work
from book.exercises.profiling import ch17_as_rate, ch17_collective_share, ch17_step_flops
from book.exercises.running import ch19_best_interval, ch19_records_of
from book.exercises.serving import ch20_largest_batch, ch20_tp_token_bytes
from book.exercises.sizing import ch18_smallest_fsdp, ch18_tp_bytes
from book.exercises.state import ch16_masked_mean_grads, ch16_restore_on
from book.exercises.training import (
    ch07_masked_mean,
    ch07_sum_dp,
    ch08_fsdp_columns,
    ch08_replicated_biases,
    ch09_megatron_block,
    ch09_two_layers,
    ch10_padded_epoch,
    ch10_read_once,
)
from book.exercises.transformer import (
    ch13_block_bytes,
    ch13_fsdp_tp_rules,
    ch13_memory_budget,
)

__all__ = [
    "ch01_chip_rows",
    "ch01_reversed_mesh",
    "ch02_predict",
    "ch02_rows_on_device_1",
    "ch02_spec_for_64_bytes",
    "ch03_gram",
    "ch03_no_communication",
    "ch03_sum_groups",
    "ch04_mlp",
    "ch04_predict_types",
    "ch04_small_operand",
    "ch05_from_five",
    "ch05_predict_all_to_all",
    "ch05_ring_sum",
    "ch06_both_ways",
    "ch06_ring_right",
    "ch07_masked_mean",
    "ch07_sum_dp",
    "ch08_fsdp_columns",
    "ch08_replicated_biases",
    "ch09_megatron_block",
    "ch09_two_layers",
    "ch10_padded_epoch",
    "ch10_read_once",
    "ch11_column_means",
    "ch11_own_rows",
    "ch12_dp_tp_bytes",
    "ch12_intensity",
    "ch12_timer",
    "ch13_block_bytes",
    "ch13_fsdp_tp_rules",
    "ch13_memory_budget",
    "ch14_in_flight",
    "ch14_microbatches",
    "ch14_stage_work",
    "ch15_all_to_all_bytes",
    "ch15_capacity",
    "ch15_merge_normalized",
    "ch16_masked_mean_grads",
    "ch16_restore_on",
    "ch17_as_rate",
    "ch17_collective_share",
    "ch17_step_flops",
    "ch18_smallest_fsdp",
    "ch18_tp_bytes",
    "ch19_best_interval",
    "ch19_records_of",
    "ch20_largest_batch",
    "ch20_tp_token_bytes",
    "ch21_stash_bytes",
    "ch21_ulysses_wins",
    "INTENSITY_SHAPES",
    "Verdict",
    "matmul_intensity",
]
