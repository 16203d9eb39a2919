"""What a language model is judged on at packaging: golden chats and a held-out text.

Short chats of the kind the agent serves (a question, an instruction, a camera event to
describe, a system prompt), whose greedy continuations are compared token by token; and an
ordinary English text, written for this purpose and in no training set, whose perplexity shows
how much a quantization lost. Fixed here, so two packagings of one model are comparable.
"""

from __future__ import annotations

GOLDEN_CHATS: tuple[tuple[dict[str, str], ...], ...] = (
    ({"role": "user", "content": "What is the capital of France?"},),
    ({"role": "user", "content": "Write one sentence about the sea."},),
    (
        {"role": "system", "content": "You describe security camera events in one sentence."},
        {"role": "user", "content": "A person and a dog walk up the driveway at night."},
    ),
    ({"role": "user", "content": "List three colours of the rainbow."},),
)

HELD_OUT = (
    "The small town sits where the river bends twice before it reaches the lake. Most mornings "
    "a thin fog hangs over the water until the sun climbs above the hills, and the fishermen "
    "wait for it to lift before they push their boats out. The bakery on the main street opens "
    "at six, and by seven there is usually a short line of people who want bread that is still "
    "warm. Children walk to the school near the old stone bridge, and their parents stop to talk "
    "about the weather, the price of fuel and the new road that the council has promised for "
    "years. In the afternoon the square is quiet. An old man feeds the pigeons from a paper bag, "
    "a delivery van unloads boxes in front of the hardware shop, and the church clock, which is "
    "always four minutes late, rings the hour. When the weather is good, families carry "
    "blankets and baskets down to the grassy bank by the water and stay until the light fades. "
    "In winter the lake sometimes freezes near the shore, and the braver teenagers test the ice "
    "with long sticks before they dare to step onto it. Visitors often say that nothing ever "
    "happens here, and the people who live in the town tend to agree, although they say it with "
    "a smile. They know which neighbour grows the best tomatoes, who will lend a ladder without "
    "asking why, and which bench in the park gets the last of the evening sun. For them, that "
    "is more than enough to fill a life."
)
