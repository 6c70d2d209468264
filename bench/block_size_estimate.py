"""The block-size bench's yardstick: the concurrency a lazy allocator can reach at a block size.

Pure arithmetic without sibling imports, so its unit test loads it by file path.
"""

from __future__ import annotations


def lazy_allocation_estimate(work: list[tuple[list[int], int]], block_size: int, kv_tokens: int) -> float:
    """Requests that fit in the pool if each holds exactly the blocks its tokens need.

    A request is in the pool for one prefill step and then one step per further answer
    token; at the step that writes position i it holds ceil((i + 1) / block_size) blocks.
    Averaging the slots held over every request-step gives the mean footprint of a
    running request; the pool divided by it is what the workload's lengths allow at this
    block size, whatever the engine does. An estimate, not a strict bound: under
    pressure the running set over-represents young requests (just admitted, or
    readmitted after preemption), which hold fewer blocks.
    """
    held = steps = 0
    for prompt, answer in work:
        lengths = [len(prompt) + k for k in range(answer)]  # the prefill step, then one per further token
        held += sum(-(-n // block_size) * block_size for n in lengths)
        steps += len(lengths)
    return kv_tokens / (held / steps)
