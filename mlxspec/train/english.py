"""English text available on every machine without a network, for heads that must draft prose as well as code.

Two sources: the Python reference's own prose (`pydoc_data.topics`, about 460k characters of technical English in
every CPython), and short openings in everyday registers (stories, recipes, news, letters, science, history) written
for this. Only prompts are taken from them: the heads learn the target's own continuations. None of the openings is
one of the held-out English prompts the benchmarks measure on (docs/results/english-prompts.jsonl).
"""

from __future__ import annotations

import numpy as np

OPENINGS = (
    "She opened the letter slowly, afraid of what it might say. The handwriting was her grandmother's, and the date",
    "The village market opens at dawn on Saturdays. Farmers arrive with crates of apples, cheese and eggs, and",
    "To grow tomatoes on a balcony, choose a sunny spot and a deep pot. Fill it with compost, then",
    "The train was already forty minutes late when the announcement came. Passengers sighed, checked their phones and",
    "Photosynthesis is the process by which plants turn light into chemical energy. Inside each leaf,",
    "In 1869 the first transcontinental railroad in the United States was completed. It connected",
    "Dear Martin, thank you for your kind note after the concert. I have been meaning to write since",
    "The city council voted on Monday night to close the old bridge for repairs. Residents who commute",
    "Volcanoes form where molten rock rises through cracks in the Earth's crust. Some erupt violently, while others",
    "When Anna moved to the coast, she did not expect to fall in love with the fog. Every morning it",
    "A good soup starts with a good stock. Roast the bones until they are deep brown, then cover them with cold water",
    "The museum's new exhibition traces the history of clocks, from water clocks in ancient Egypt to",
    "Sleep is not simply a pause in the day. While we rest, the brain sorts memories,",
    "The old man at the end of the street kept bees. In summer the air around his garden hummed, and children",
    "Our hiking group set out before sunrise. The trail climbed steeply through pine forest until",
    "Honeybees communicate the location of flowers through a movement known as the waggle dance.",
    "The restaurant on the corner has changed owners three times in five years, but the new chef",
    "Learning a second language as an adult is hard, but not impossible. The most useful habit is",
    "The storm arrived earlier than the forecast had promised. By noon the harbor was empty and",
    "Ancient Rome depended on its aqueducts. Water flowed for miles along gentle slopes, carried by",
    "I had never seen snow until the winter I turned twelve. My father woke me before dawn and",
    "The report found that most households in the region spend more on energy than they did a decade ago.",
    "Coffee was first cultivated in Yemen, where Sufi monks drank it to stay awake during night prayers.",
    "The detective looked at the muddy boots by the door and then at the clean floor. Someone had",
    "Before you paint a room, wash the walls and let them dry. Tape the edges of the windows, and",
    "The school announced on Friday that classes will start an hour later next year, after parents",
    "The moon has no light of its own. What we see at night is sunlight reflected from",
    "Her first job was at a small bookshop that smelled of dust and paper. The owner, a tall woman named",
    "Glaciers move slowly, often less than a meter a day, yet over centuries they",
    "The match was tied in the final minute when the young striker",
    "A budget is a plan for your money. Start by writing down everything you earn in a month, then",
    "The island's only doctor visits each village once a week, travelling by boat when the roads",
    "Early printing presses used movable type made of metal. Each letter had to be set by hand, and",
    "The wind had been blowing from the north for three days, and the sheep huddled against the stone wall.",
    "Many birds migrate thousands of kilometers each year. Scientists once wondered how they",
    "The company said on Wednesday that it would hire two hundred workers at its new factory, which",
    "My neighbor plays the piano every evening at seven. At first the music annoyed me, but",
    "Salt has shaped history. Roads were built to carry it, cities grew where it was found, and",
    "The recipe calls for two cups of flour, one cup of sugar and three eggs. First, preheat the oven to",
    "Nobody in the family could remember who had planted the oak tree behind the house. It was",
)


def english_documents() -> list[str]:
    """The reference's prose topics (in a fixed order) and the openings, one document each."""
    from pydoc_data.topics import topics

    return [topics[name] for name in sorted(topics)] + list(OPENINGS)


def english_stream(tokenizer) -> np.ndarray:
    """Every English document tokenized, each followed by end-of-sequence, as one stream of ids."""
    ids: list[int] = []
    for text in english_documents():
        ids += tokenizer.encode(text) + [tokenizer.eos_token_id]
    return np.asarray(ids, dtype=np.int32)
