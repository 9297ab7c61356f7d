"""A short text that calibrations run the model over once: chat, code, prose and a translation, as edge's prompts mix
them (layer-skip sets: edge/drafters/skip_calibration.py; key scales: edge/key_scales.py)."""

CALIBRATION_TEXT = (
    "User: How do I read a CSV file in Python?\n"
    "Assistant: Use the csv module: open the file with open('data.csv', newline='') and pass it to csv.reader, "
    "which yields each row as a list of strings.\n"
    "def mean(values):\n    return sum(values) / len(values)\n"
    "The river rises in the mountains and flows east for three hundred miles before it reaches the sea. "
    "Translate to French: The weather is nice today. Le temps est beau aujourd'hui."
)
