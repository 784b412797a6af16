"""The words the letter-counting skill asks about: common lowercase English words of 3 to 10 letters.

A fixed list (not a download) so the demo data is reproducible; the tokenizer's merges are trained on text containing
them, and the model learns to spell each one letter by letter.
"""

from __future__ import annotations

WORDS: tuple[str, ...] = tuple(dict.fromkeys(
    """
    apple banana cherry grape lemon mango melon orange peach pear plum berry strawberry raspberry blueberry kiwi
    tomato potato carrot onion garlic pepper celery radish turnip pumpkin squash cabbage lettuce spinach broccoli
    bread butter cheese honey sugar salt flour rice pasta pizza cookie muffin waffle pancake noodle soup salad
    water coffee tea juice milk cocoa
    cat dog horse sheep goat cow pig mouse rabbit tiger lion zebra giraffe monkey donkey camel llama panda koala
    otter beaver badger ferret weasel squirrel hamster parrot pigeon eagle falcon hawk owl raven robin sparrow
    swallow penguin turtle lizard snake frog toad shark whale dolphin salmon trout octopus lobster oyster beetle
    spider ant bee wasp hornet butterfly moth
    tree forest river ocean mountain valley desert island meadow garden flower petal leaf branch root seed
    cloud rain snow storm thunder lightning rainbow sunrise sunset summer winter autumn spring breeze
    house window door roof floor wall kitchen bedroom garage cellar attic ladder hammer nail screw drill
    table chair sofa lamp mirror pillow blanket carpet curtain shelf drawer basket bottle bucket kettle
    teapot spoon fork knife plate bowl cup glass jar
    red blue green yellow purple pink brown black white silver golden
    book letter paper pencil marker eraser ruler scissors stapler folder notebook journal library
    school teacher student lesson number answer question puzzle riddle story poem song music guitar piano
    violin trumpet drum flute banjo
    computer keyboard monitor printer laptop tablet phone camera speaker router server kernel memory cache
    thread socket packet signal vector matrix tensor expert token model layer engine tessera
    train plane rocket bicycle scooter truck wagon boat canoe ferry subway tunnel bridge street road
    city village castle palace tower temple church market bakery office museum theater stadium hospital
    doctor nurse farmer baker pilot sailor painter writer singer dancer player driver
    happy sad angry calm brave clever gentle honest lucky quiet proud shy silly
    quick slow early late small large tiny giant short long narrow wide heavy light
    run walk jump swim climb dance sing read write draw paint cook bake clean sleep dream laugh smile
    hello goodbye thanks please sorry
    mississippi banana committee balloon coffee bookkeeper address success letter pepper assessment
    accommodate necessary occurrence parallel tomorrow referee raccoon cheetah kangaroo hippo
    """.split()
    )
)
