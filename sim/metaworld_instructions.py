"""Instructions of Meta-World tasks (sim.metaworld_env.metaworld_instruction), kept apart so that module stays
short."""

# Hand-written instructions for the common families; anything else falls back to the task name in words.
INSTRUCTIONS = {
    "reach": "reach the goal position",
    "reach-wall": "reach the goal position behind the wall",
    "push": "push the puck to the goal",
    "push-wall": "push the puck around the wall to the goal",
    "push-back": "push the puck back to the goal",
    "pick-place": "pick up the puck and place it at the goal",
    "pick-place-wall": "pick up the puck, lift it over the wall and place it at the goal",
    "door-open": "open the door",
    "door-close": "close the door",
    "door-lock": "lock the door",
    "door-unlock": "unlock the door",
    "drawer-open": "open the drawer",
    "drawer-close": "close the drawer",
    "button-press": "press the button",
    "window-open": "open the window",
    "window-close": "close the window",
    "faucet-open": "open the faucet",
    "faucet-close": "close the faucet",
    "peg-insert-side": "insert the peg into the hole from the side",
    "basketball": "put the ball into the basket",
    "sweep-into": "sweep the puck into the hole",
    "coffee-button": "press the button on the coffee machine",
    "shelf-place": "pick up the puck and place it on the shelf",
}
